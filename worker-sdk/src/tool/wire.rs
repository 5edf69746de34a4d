//! A tool's definition as the kernel registers it (`ToolSpec`, `ToolOptions`).

use kernel_proto::canonical::{to_canonical, tool_fingerprint};
use kernel_proto::v1 as pb;

use super::{Approval, Effect, Idempotency, RetryPolicy, RiskLevel, ToolDefinition, ToolOptions};
use crate::fields::{millis, optional_millis};

pub(crate) fn tool_spec(definition: &ToolDefinition) -> pb::ToolSpec {
    let ToolDefinition {
        name,
        description,
        input_schema,
        version,
        options,
    } = definition;
    pb::ToolSpec {
        name: name.clone(),
        description: description.clone(),
        input_schema_json: to_canonical(input_schema),
        version: version.clone(),
        fingerprint: tool_fingerprint(name, description, input_schema, version),
        options: Some(tool_options(options)),
    }
}

fn tool_options(options: &ToolOptions) -> pb::ToolOptions {
    // The predicate alone decides when it is set; `requires_approval` then stays false so a
    // kernel reading either field asks only when the predicate holds.
    let (requires_approval, requires_approval_expr) = match &options.approval {
        Approval::Never => (false, String::new()),
        Approval::Always => (true, String::new()),
        Approval::When(expr) => (false, expr.clone()),
    };
    pb::ToolOptions {
        timeout_ms: optional_millis(options.timeout),
        retry: options.retry.as_ref().map(retry_policy),
        idempotency: idempotency(options.idempotency) as i32,
        read_only: options.effect == Effect::ReadOnly,
        writes: options.effect == Effect::Writes,
        owner: options.owner.clone().unwrap_or_default(),
        risk: options.risk.map_or(pb::RiskLevel::Unspecified, risk_level) as i32,
        permissions: options.permissions.clone(),
        resources: options.resources.clone(),
        cost_per_call: options.cost_per_call,
        cache_ttl_ms: optional_millis(options.cache_ttl),
        requires_approval,
        requires_approval_expr,
        approval_timeout_ms: optional_millis(options.approval_timeout),
        blocking: options.blocking,
        strip_nulls: options.strip_nulls,
        // A Rust tool's predicate is CEL (`Approval::When`), which the kernel evaluates itself.
        approval_predicate_in_worker: false,
        limit: options.limit.map(|limit| pb::ToolLimitOptions {
            per_second: limit.per_second,
            burst: limit.burst,
            at_once: limit.at_once,
        }),
        secret: options.secret.clone(),
    }
}

fn retry_policy(policy: &RetryPolicy) -> pb::RetryPolicy {
    pb::RetryPolicy {
        max_attempts: policy.max_attempts,
        initial_interval_ms: millis(policy.initial_interval),
        backoff_coefficient: policy.backoff_coefficient,
        max_interval_ms: millis(policy.max_interval),
    }
}

fn idempotency(idempotency: Idempotency) -> pb::Idempotency {
    match idempotency {
        Idempotency::SafeToRetry => pb::Idempotency::SafeToRetry,
        Idempotency::AtMostOnce => pb::Idempotency::AtMostOnce,
    }
}

fn risk_level(risk: RiskLevel) -> pb::RiskLevel {
    match risk {
        RiskLevel::Low => pb::RiskLevel::Low,
        RiskLevel::Medium => pb::RiskLevel::Medium,
        RiskLevel::High => pb::RiskLevel::High,
        RiskLevel::Critical => pb::RiskLevel::Critical,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn options_map_one_to_one() {
        let options = ToolOptions {
            timeout: Some(Duration::from_millis(1500)),
            retry: Some(RetryPolicy::retries(3)),
            idempotency: Idempotency::AtMostOnce,
            effect: Effect::Writes,
            owner: Some("payments".into()),
            risk: Some(RiskLevel::High),
            permissions: vec!["billing:write".into()],
            resources: vec!["ledger".into()],
            secret: vec!["api_key".into()],
            cost_per_call: 0.25,
            cache_ttl: Some(Duration::from_secs(300)),
            approval: Approval::When("args.cents > 10000".into()),
            approval_timeout: Some(Duration::from_secs(3600)),
            blocking: true,
            strip_nulls: true,
            limit: Some(crate::tool::ToolLimit {
                per_second: Some(10.0),
                burst: None,
                at_once: Some(4),
            }),
        };
        let pb = tool_options(&options);
        assert_eq!(pb.timeout_ms, 1500);
        assert_eq!(pb.retry.unwrap().max_attempts, 4);
        assert_eq!(pb.idempotency, pb::Idempotency::AtMostOnce as i32);
        assert!(pb.writes && !pb.read_only);
        assert_eq!(pb.owner, "payments");
        assert_eq!(pb.risk, pb::RiskLevel::High as i32);
        assert_eq!(pb.permissions, ["billing:write"]);
        assert_eq!(pb.resources, ["ledger"]);
        assert_eq!(pb.secret, ["api_key"]);
        assert_eq!(pb.cost_per_call, 0.25);
        assert_eq!(pb.cache_ttl_ms, 300_000);
        assert!(!pb.requires_approval);
        assert_eq!(pb.requires_approval_expr, "args.cents > 10000");
        assert_eq!(pb.approval_timeout_ms, 3_600_000);
        assert!(pb.blocking);
        assert!(pb.strip_nulls);
        assert_eq!(
            pb.limit,
            Some(pb::ToolLimitOptions {
                per_second: Some(10.0),
                burst: None,
                at_once: Some(4)
            })
        );

        let defaults = tool_options(&ToolOptions::default());
        assert_eq!(defaults.timeout_ms, 0);
        assert!(defaults.retry.is_none());
        assert_eq!(defaults.idempotency, pb::Idempotency::SafeToRetry as i32);
        assert_eq!(defaults.risk, pb::RiskLevel::Unspecified as i32);
    }
}
