//! Table-driven tests of presets, rules, their combination, predicates and refused files.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

/// An owned call, turned into [`CallFacts`] for each decision.
#[derive(Clone)]
struct Call {
    tool: String,
    args: Value,
    risk: Option<Risk>,
    read_only: bool,
    writes: bool,
    permissions: Vec<String>,
    resources: Vec<String>,
    tool_requires_approval: bool,
    agent: String,
    labels: BTreeMap<String, String>,
    run_permissions: Vec<String>,
}

fn call(tool: &str) -> Call {
    Call {
        tool: tool.to_owned(),
        args: json!({}),
        risk: None,
        read_only: false,
        writes: false,
        permissions: Vec::new(),
        resources: Vec::new(),
        tool_requires_approval: false,
        agent: "agent".to_owned(),
        labels: BTreeMap::new(),
        run_permissions: Vec::new(),
    }
}

impl Call {
    fn args(mut self, args: Value) -> Self {
        self.args = args;
        self
    }
    fn risk(mut self, risk: Risk) -> Self {
        self.risk = Some(risk);
        self
    }
    fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
    fn writes(mut self) -> Self {
        self.writes = true;
        self
    }
    fn needs(mut self, permissions: &[&str]) -> Self {
        self.permissions = permissions.iter().map(|p| p.to_string()).collect();
        self
    }
    fn touching(mut self, resources: &[&str]) -> Self {
        self.resources = resources.iter().map(|r| r.to_string()).collect();
        self
    }
    fn granted(mut self, permissions: &[&str]) -> Self {
        self.run_permissions = permissions.iter().map(|p| p.to_string()).collect();
        self
    }
    fn requiring_approval(mut self) -> Self {
        self.tool_requires_approval = true;
        self
    }
    fn agent(mut self, agent: &str) -> Self {
        self.agent = agent.to_owned();
        self
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }
    fn facts(&self) -> CallFacts<'_> {
        CallFacts {
            tool: &self.tool,
            args: &self.args,
            risk: self.risk,
            read_only: self.read_only,
            writes: self.writes,
            permissions: &self.permissions,
            resources: &self.resources,
            tool_requires_approval: self.tool_requires_approval,
            run_agent: &self.agent,
            run_labels: &self.labels,
            run_permissions: &self.run_permissions,
        }
    }
}

fn policy(yaml: &str) -> Policy {
    Policy::from_yaml(yaml).unwrap_or_else(|e| panic!("policy should load: {e}\n{yaml}"))
}

fn decide(yaml: &str, call: &Call) -> Decision {
    policy(yaml).decide(&call.facts())
}

/// `(verdict, decided_by)` for compact table rows.
fn outcome(decision: &Decision) -> (&'static str, &str) {
    (decision.verdict.as_str(), decision.decided_by.as_str())
}

fn reason(decision: &Decision) -> &str {
    match &decision.verdict {
        Verdict::Deny { reason } => reason,
        other => panic!("expected a deny, got {other:?}"),
    }
}

fn approval(decision: &Decision) -> (Option<u64>, Vec<String>, Option<String>) {
    match &decision.verdict {
        Verdict::Approve {
            timeout_ms,
            approvers,
            message,
        } => (*timeout_ms, approvers.clone(), message.clone()),
        other => panic!("expected an approval, got {other:?}"),
    }
}

fn refused(yaml: &str) -> PolicyError {
    match Policy::from_yaml(yaml) {
        Ok(_) => panic!("policy should be refused:\n{yaml}"),
        Err(e) => e,
    }
}

/// Asserts the line and that the reason contains `needle`.
fn assert_refused(yaml: &str, line: usize, needle: &str) {
    let error = refused(yaml);
    assert_eq!(error.line, Some(line), "line of {error}\n{yaml}");
    assert!(
        error.reason.contains(needle),
        "reason '{}' lacks '{needle}'\n{yaml}",
        error.reason
    );
}

// ---- presets alone -------------------------------------------------------------------------

#[test]
fn allow_all_allows_every_call_by_default() {
    let decision = Policy::allow_all().decide(&call("anything").risk(Risk::Critical).facts());
    assert_eq!(outcome(&decision), ("allow", "default:allow"));
}

#[test]
fn explicit_default_allow_is_allow_all() {
    assert_eq!(
        outcome(&decide("default: allow", &call("x"))),
        ("allow", "default:allow")
    );
}

#[test]
fn default_deny_denies_every_call_nothing_allows() {
    let decision = decide("default: deny", &call("add"));
    assert_eq!(outcome(&decision), ("deny", "default:deny"));
    assert!(reason(&decision).contains("denies every call"));
}

#[test]
fn default_deny_yields_to_an_allow_rule() {
    let yaml = "default: deny\nrules:\n  - id: adds\n    match: { tools: [add] }\n    decision: allow\n";
    assert_eq!(outcome(&decide(yaml, &call("add"))), ("allow", "rule:adds"));
    assert_eq!(outcome(&decide(yaml, &call("sub"))), ("deny", "default:deny"));
}

#[test]
fn deny_list_star_is_a_kill_switch_over_allow_rules() {
    let yaml = "deny_list: ['*']\nrules:\n  - id: adds\n    decision: allow\n";
    let decision = decide(yaml, &call("add"));
    assert_eq!(outcome(&decision), ("deny", "preset:deny_list"));
    assert_eq!(reason(&decision), "matches the policy's deny_list entry '*'");
}

#[test]
fn allow_list_globs() {
    let cases: &[(&str, &str, bool)] = &[
        ("*", "anything_at-all", true),
        ("read_*", "read_file", true),
        ("read_*", "read_", true),
        ("read_*", "read", false),
        ("read_*", "xread_file", false),
        ("add", "add", true),
        ("add", "add2", false),
        ("add", "ad", false),
        ("Add", "add", false),
        ("get_?", "get_a", true),
        ("get_?", "get_", false),
        ("get_?", "get_ab", false),
        ("billing-refund", "billing-refund", true),
        ("billing-*", "billing_refund", false),
        ("billing_*", "billing_refund", true),
        ("mcp.*", "mcp.github/search", true),
        ("[ab]dd", "bdd", true),
        ("[ab]dd", "cdd", false),
        ("{read,list}_*", "list_files", true),
        ("{read,list}_*", "write_files", false),
        ("a\\*", "a*", true),
        ("a\\*", "ab", false),
    ];
    for (glob, tool, allowed) in cases {
        let yaml = format!("allow_list: ['{glob}']");
        let decision = decide(&yaml, &call(tool));
        let expected = if *allowed { "allow" } else { "deny" };
        assert_eq!(
            outcome(&decision),
            (expected, "preset:allow_list"),
            "glob {glob} tool {tool}"
        );
    }
}

#[test]
fn allow_list_denial_names_the_list() {
    let decision = decide("allow_list: [add, 'read_*']", &call("rm"));
    assert_eq!(reason(&decision), "not on the policy's allow_list (add, read_*)");
    assert_eq!(
        decision.denial_text("rm").as_deref(),
        Some("rm not allowed. reason: not on the policy's allow_list (add, read_*)")
    );
}

#[test]
fn deny_list_names_the_matching_entry_and_passes_the_rest() {
    let yaml = "deny_list: [drop_table, 'rm_*']";
    let denied = decide(yaml, &call("rm_rf"));
    assert_eq!(outcome(&denied), ("deny", "preset:deny_list"));
    assert_eq!(reason(&denied), "matches the policy's deny_list entry 'rm_*'");
    assert_eq!(outcome(&decide(yaml, &call("rm"))), ("allow", "default:allow"));
}

#[test]
fn max_risk_with_ceiling_and_band() {
    let yaml = "max_risk: { ceiling: high, approve_above: medium }";
    let cases: &[(Option<Risk>, &str, &str)] = &[
        (None, "allow", "default:allow"),
        (Some(Risk::Low), "allow", "default:allow"),
        (Some(Risk::Medium), "allow", "default:allow"),
        (Some(Risk::High), "approve", "preset:max_risk"),
        (Some(Risk::Critical), "deny", "preset:max_risk"),
    ];
    for (risk, verdict, by) in cases {
        let mut c = call("t");
        c.risk = *risk;
        assert_eq!(outcome(&decide(yaml, &c)), (*verdict, *by), "risk {risk:?}");
    }
}

#[test]
fn max_risk_messages() {
    let yaml = "max_risk: { ceiling: high, approve_above: medium }";
    let denied = decide(yaml, &call("t").risk(Risk::Critical));
    assert_eq!(reason(&denied), "risk critical is above the policy's ceiling (high)");
    let asked = decide(yaml, &call("t").risk(Risk::High));
    assert_eq!(
        approval(&asked),
        (
            None,
            vec![],
            Some("risk high is above medium, so a person must approve".to_owned())
        )
    );
}

#[test]
fn max_risk_ceiling_alone_denies_above_and_allows_at() {
    let yaml = "max_risk: { ceiling: medium }";
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::Medium))),
        ("allow", "default:allow")
    );
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::High))),
        ("deny", "preset:max_risk")
    );
}

#[test]
fn max_risk_band_alone_asks_up_to_critical() {
    let yaml = "max_risk: { approve_above: medium }";
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::Critical))),
        ("approve", "preset:max_risk")
    );
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::Medium))),
        ("allow", "default:allow")
    );
}

#[test]
fn max_risk_band_equal_to_ceiling_never_asks() {
    let yaml = "max_risk: { ceiling: high, approve_above: high }";
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::High))),
        ("allow", "default:allow")
    );
    assert_eq!(
        outcome(&decide(yaml, &call("t").risk(Risk::Critical))),
        ("deny", "preset:max_risk")
    );
}

#[test]
fn require_permissions() {
    let yaml = "require_permissions: true";
    let cases: &[(&[&str], &[&str], &str)] = &[
        (&[], &[], "allow"),
        (&["billing:write"], &["billing:write", "other"], "allow"),
        (&["billing:write", "billing:read"], &["billing:read"], "deny"),
        (&["billing:write"], &[], "deny"),
    ];
    for (needs, granted, verdict) in cases {
        let decision = decide(yaml, &call("refund").needs(needs).granted(granted));
        assert_eq!(
            decision.verdict.as_str(),
            *verdict,
            "needs {needs:?} granted {granted:?}"
        );
    }
}

#[test]
fn require_permissions_names_every_missing_permission_once() {
    let c = call("refund")
        .needs(&["billing:write", "billing:read", "audit:write", "billing:write"])
        .granted(&["billing:read"]);
    let decision = decide("require_permissions: true", &c);
    assert_eq!(outcome(&decision), ("deny", "preset:require_permissions"));
    assert_eq!(
        reason(&decision),
        "the run lacks required permission(s): billing:write, audit:write"
    );
}

#[test]
fn require_permissions_off_ignores_missing_permissions() {
    let c = call("refund").needs(&["billing:write"]);
    assert_eq!(
        outcome(&decide("require_permissions: false", &c)),
        ("allow", "default:allow")
    );
}

// ---- rules ---------------------------------------------------------------------------------

#[test]
fn higher_priority_rule_decides_first() {
    let yaml = "
rules:
  - id: low
    priority: 1
    decision: allow
  - id: high
    priority: 10
    decision: deny
    reason: no
  - id: negative
    priority: -5
    decision: approve
";
    assert_eq!(outcome(&decide(yaml, &call("t"))), ("deny", "rule:high"));
}

#[test]
fn equal_priorities_keep_file_order() {
    let yaml = "
rules:
  - id: first
    decision: approve
  - id: second
    decision: deny
    reason: later
";
    assert_eq!(outcome(&decide(yaml, &call("t"))), ("approve", "rule:first"));
}

#[test]
fn only_the_first_matching_rule_contributes() {
    let yaml = "
rules:
  - id: reads
    match: { tools: ['read_*'] }
    decision: allow
  - id: everything
    decision: deny
    reason: closed
";
    assert_eq!(outcome(&decide(yaml, &call("read_file"))), ("allow", "rule:reads"));
    assert_eq!(outcome(&decide(yaml, &call("write_file"))), ("deny", "rule:everything"));
}

#[test]
fn a_rule_without_match_matches_every_call() {
    let yaml = "rules:\n  - id: all\n    match: {}\n    decision: approve\n";
    assert_eq!(outcome(&decide(yaml, &call("t"))), ("approve", "rule:all"));
}

#[test]
fn each_matcher() {
    let rule = |matcher: &str| format!("rules:\n  - id: r\n    match: {matcher}\n    decision: deny\n    reason: x\n");
    let cases: Vec<(&str, Call, bool)> = vec![
        ("{ tools: ['refund*'] }", call("refund_card"), true),
        ("{ tools: ['refund*'] }", call("charge"), false),
        ("{ agents: ['billing-*'] }", call("t").agent("billing-bot"), true),
        ("{ agents: ['billing-*'] }", call("t").agent("support-bot"), false),
        ("{ risk: [high, critical] }", call("t").risk(Risk::High), true),
        ("{ risk: [high, critical] }", call("t").risk(Risk::Medium), false),
        ("{ risk: [low] }", call("t"), true),
        ("{ risk: [medium] }", call("t"), false),
        ("{ read_only: true }", call("t").read_only(), true),
        ("{ read_only: true }", call("t"), false),
        ("{ read_only: false }", call("t").writes(), true),
        ("{ writes: true }", call("t").writes(), true),
        ("{ writes: true }", call("t").read_only(), false),
        ("{ writes: false }", call("t").read_only(), true),
        ("{ when: \"tool == 't'\" }", call("t"), true),
        ("{ when: \"tool == 't'\" }", call("u"), false),
        (
            "{ when: \"run.agent.startsWith('ops')\" }",
            call("t").agent("ops-1"),
            true,
        ),
        (
            "{ when: \"run.agent.startsWith('ops')\" }",
            call("t").agent("dev-1"),
            false,
        ),
        ("{ resources: [workspace] }", call("t").touching(&["workspace"]), true),
        ("{ resources: [workspace] }", call("t").touching(&["ledger"]), false),
        ("{ resources: [workspace] }", call("t"), false),
        (
            "{ resources: [repo] }",
            call("t").touching(&["ledger", "repo:acme/api"]),
            true,
        ),
        (
            "{ resources: ['repo:acme/*'] }",
            call("t").touching(&["repo:acme/api"]),
            true,
        ),
        (
            "{ resources: ['repo:acme/*'] }",
            call("t").touching(&["repo:other/api"]),
            false,
        ),
        (
            "{ when: \"'repo:acme/api' in resources\" }",
            call("t").touching(&["repo:acme/api"]),
            true,
        ),
        ("{ when: \"resources.size() > 0\" }", call("t"), false),
        (
            "{ tools: [refund], risk: [high] }",
            call("refund").risk(Risk::Low),
            false,
        ),
        (
            "{ tools: [refund], risk: [high] }",
            call("refund").risk(Risk::High),
            true,
        ),
    ];
    for (matcher, c, matches) in cases {
        let decision = decide(&rule(matcher), &c);
        let expected = if matches {
            ("deny", "rule:r")
        } else {
            ("allow", "default:allow")
        };
        assert_eq!(outcome(&decision), expected, "matcher {matcher} tool {}", c.tool);
    }
}

const REFUNDS: &str = "
rules:
  - id: no-big-refunds
    match:
      tools: ['refund*']
      when: \"args.cents > 10000 && run.labels.env == 'prod'\"
    decision: approve
    reason: refunds over $100 need a person
    approval: { timeout: 1h, approvers: [payments-oncall], message: check the ticket }
";

#[test]
fn cel_over_args_and_labels() {
    let cases: &[(Value, &str, &str)] = &[
        (json!({"cents": 20000}), "prod", "approve"),
        (json!({"cents": 10000}), "prod", "allow"),
        (json!({"cents": 20000}), "staging", "allow"),
        (json!({"cents": 20000.5}), "prod", "approve"),
    ];
    for (args, env, verdict) in cases {
        let c = call("refund").args(args.clone()).label("env", env);
        assert_eq!(decide(REFUNDS, &c).verdict.as_str(), *verdict, "args {args} env {env}");
    }
}

#[test]
fn an_approve_rule_carries_its_approval_block() {
    let c = call("refund").args(json!({"cents": 20000})).label("env", "prod");
    let decision = decide(REFUNDS, &c);
    assert_eq!(decision.decided_by, "rule:no-big-refunds");
    assert_eq!(
        approval(&decision),
        (
            Some(3_600_000),
            vec!["payments-oncall".to_owned()],
            Some("check the ticket".to_owned())
        )
    );
}

#[test]
fn an_approve_rule_without_message_shows_its_reason() {
    let yaml = "rules:\n  - id: r\n    decision: approve\n    reason: big\n";
    assert_eq!(
        approval(&decide(yaml, &call("t"))),
        (None, vec![], Some("big".to_owned()))
    );
}

#[test]
fn missing_label_fails_closed_for_an_approve_rule() {
    let c = call("refund").args(json!({"cents": 20000}));
    let decision = decide(REFUNDS, &c);
    assert_eq!(outcome(&decision), ("approve", "rule:no-big-refunds"));
    let (_, _, message) = approval(&decision);
    assert_eq!(
        message.as_deref(),
        Some("check the ticket (policy rule no-big-refunds could not be evaluated: No such key: env)")
    );
}

#[test]
fn missing_label_fails_closed_for_a_deny_rule() {
    let yaml = "rules:\n  - id: prod-only\n    match: { when: \"run.labels.env != 'prod'\" }\n    decision: deny\n    reason: prod only\n";
    let decision = decide(yaml, &call("t"));
    assert_eq!(outcome(&decision), ("deny", "rule:prod-only"));
    assert_eq!(
        reason(&decision),
        "prod only (policy rule prod-only could not be evaluated: No such key: env)"
    );
}

#[test]
fn missing_label_turns_an_allow_rule_into_a_deny() {
    let yaml = "default: deny\nrules:\n  - id: staging\n    match: { when: \"run.labels.env == 'staging'\" }\n    decision: allow\n";
    let decision = decide(yaml, &call("t"));
    assert_eq!(outcome(&decision), ("deny", "rule:staging"));
    assert_eq!(
        reason(&decision),
        "policy rule staging could not be evaluated: No such key: env"
    );
    let labelled = decide(yaml, &call("t").label("env", "staging"));
    assert_eq!(outcome(&labelled), ("allow", "rule:staging"));
}

#[test]
fn a_guarded_condition_does_not_fail() {
    let yaml = "rules:\n  - id: r\n    match: { when: \"has(run.labels.env) && run.labels.env == 'prod'\" }\n    decision: deny\n    reason: x\n";
    assert_eq!(outcome(&decide(yaml, &call("t"))), ("allow", "default:allow"));
    assert_eq!(
        outcome(&decide(yaml, &call("t").label("env", "prod"))),
        ("deny", "rule:r")
    );
}

#[test]
fn a_type_error_in_a_condition_fails_closed() {
    let yaml = "rules:\n  - id: r\n    match: { when: \"args.cents > 10\" }\n    decision: allow\n";
    let decision = decide(yaml, &call("t").args(json!({"cents": "lots"})));
    assert_eq!(outcome(&decision), ("deny", "rule:r"));
    assert!(reason(&decision).starts_with("policy rule r could not be evaluated: "));
}

#[test]
fn a_condition_that_is_not_a_bool_fails_closed() {
    let yaml = "rules:\n  - id: r\n    match: { when: \"args.cents\" }\n    decision: allow\n";
    let decision = decide(yaml, &call("t").args(json!({"cents": 5})));
    assert_eq!(
        reason(&decision),
        "policy rule r could not be evaluated: evaluated to a int instead of a bool"
    );
}

#[test]
fn a_failing_condition_stops_at_its_rule() {
    let yaml = "
rules:
  - id: broken
    priority: 5
    match: { when: \"args.missing == 1\" }
    decision: allow
  - id: fine
    decision: allow
";
    assert_eq!(outcome(&decide(yaml, &call("t"))), ("deny", "rule:broken"));
}

#[test]
fn conditions_support_macros_over_args() {
    let yaml = "rules:\n  - id: r\n    match: { when: \"args.items.exists(i, i.qty > 5)\" }\n    decision: approve\n";
    let big = call("t").args(json!({"items": [{"qty": 1}, {"qty": 9}]}));
    let small = call("t").args(json!({"items": [{"qty": 1}]}));
    assert_eq!(outcome(&decide(yaml, &big)), ("approve", "rule:r"));
    assert_eq!(outcome(&decide(yaml, &small)), ("allow", "default:allow"));
}

// ---- combination: strictest wins --------------------------------------------------------

#[test]
fn strictest_contribution_wins() {
    let allow_rule = "rules:\n  - id: ok\n    decision: allow\n";
    let deny_rule = "rules:\n  - id: no\n    decision: deny\n    reason: closed\n";
    let approve_rule = "rules:\n  - id: ask\n    decision: approve\n";
    let cases: Vec<(String, Call, &str, &str)> = vec![
        (
            format!("allow_list: [add]\n{allow_rule}"),
            call("rm"),
            "deny",
            "preset:allow_list",
        ),
        (
            format!("allow_list: [add]\n{allow_rule}"),
            call("add"),
            "allow",
            "preset:allow_list",
        ),
        (
            format!("max_risk: {{ approve_above: low }}\n{deny_rule}"),
            call("t").risk(Risk::High),
            "deny",
            "rule:no",
        ),
        (
            format!("max_risk: {{ approve_above: low }}\n{allow_rule}"),
            call("t").risk(Risk::High),
            "approve",
            "preset:max_risk",
        ),
        (
            format!("max_risk: {{ ceiling: medium }}\n{approve_rule}"),
            call("t").risk(Risk::High),
            "deny",
            "preset:max_risk",
        ),
        (
            format!("allow_list: [t]\nrequire_permissions: true\n{allow_rule}"),
            call("u").needs(&["p"]),
            "deny",
            "preset:allow_list",
        ),
        (
            format!("require_permissions: true\n{deny_rule}"),
            call("t").needs(&["p"]),
            "deny",
            "preset:require_permissions",
        ),
        (
            allow_rule.to_owned(),
            call("t").requiring_approval(),
            "approve",
            "tool:requires_approval",
        ),
        (deny_rule.to_owned(), call("t").requiring_approval(), "deny", "rule:no"),
        (
            approve_rule.to_owned(),
            call("t").requiring_approval(),
            "approve",
            "rule:ask",
        ),
        (
            "max_risk: { approve_above: low }".to_owned(),
            call("t").risk(Risk::High).requiring_approval(),
            "approve",
            "preset:max_risk",
        ),
    ];
    for (yaml, c, verdict, by) in cases {
        assert_eq!(outcome(&decide(&yaml, &c)), (verdict, by), "{yaml}");
    }
}

#[test]
fn tool_requires_approval_applies_under_allow_all() {
    let decision = Policy::allow_all().decide(&call("refund").requiring_approval().facts());
    assert_eq!(outcome(&decision), ("approve", "tool:requires_approval"));
    assert_eq!(approval(&decision), (None, vec![], None));
}

#[test]
fn escalations_do_not_override_default_deny() {
    let banded = "default: deny\nmax_risk: { approve_above: low }";
    assert_eq!(
        outcome(&decide(banded, &call("t").risk(Risk::High))),
        ("deny", "default:deny")
    );
    let flagged = decide("default: deny", &call("t").requiring_approval());
    assert_eq!(outcome(&flagged), ("deny", "default:deny"));
    let granted = "default: deny\nallow_list: [t]\nmax_risk: { approve_above: low }";
    assert_eq!(
        outcome(&decide(granted, &call("t").risk(Risk::High))),
        ("approve", "preset:max_risk")
    );
}

#[test]
fn an_approve_rule_grants_under_default_deny() {
    let yaml = "default: deny\nrules:\n  - id: ask\n    match: { tools: [refund] }\n    decision: approve\n";
    assert_eq!(outcome(&decide(yaml, &call("refund"))), ("approve", "rule:ask"));
}

#[test]
fn equally_strict_approvals_merge_their_details() {
    let yaml = "
max_risk: { approve_above: low }
rules:
  - id: ask
    decision: approve
    approval: { timeout: 5m, approvers: [oncall], message: look closely }
";
    let decision = decide(yaml, &call("t").risk(Risk::High).requiring_approval());
    assert_eq!(decision.decided_by, "preset:max_risk");
    assert_eq!(
        approval(&decision),
        (
            Some(300_000),
            vec!["oncall".to_owned()],
            Some("risk high is above low, so a person must approve; look closely".to_owned())
        )
    );
}

#[test]
fn policy_is_cheap_to_share_across_threads() {
    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    assert_shareable::<Policy>();
    assert_shareable::<Predicate>();
    let p = policy(REFUNDS);
    let handle = std::thread::spawn(move || {
        let c = call("refund").args(json!({"cents": 20000})).label("env", "prod");
        p.decide(&c.facts()).verdict.as_str()
    });
    assert_eq!(handle.join().ok(), Some("approve"));
}

// ---- a tool's own requires_approval predicate ----------------------------------------------

#[test]
fn predicate_evaluates_over_args() {
    let predicate = compile_predicate("args.cents > 10000").unwrap();
    assert_eq!(predicate.source(), "args.cents > 10000");
    assert_eq!(predicate.eval(&json!({"cents": 10001})), Ok(true));
    assert_eq!(predicate.eval(&json!({"cents": 10000})), Ok(false));
    assert_eq!(predicate.eval(&json!({"cents": 1e9})), Ok(true));
}

#[test]
fn predicate_eval_errors() {
    let predicate = compile_predicate("args.cents > 10000").unwrap();
    assert_eq!(predicate.eval(&json!({})), Err("No such key: cents".to_owned()));
    assert!(predicate.eval(&json!({"cents": "many"})).is_err());
    let not_bool = compile_predicate("args.cents").unwrap();
    assert_eq!(
        not_bool.eval(&json!({"cents": 1})),
        Err("evaluated to a int instead of a bool".to_owned())
    );
}

#[test]
fn predicate_compile_errors() {
    let cases: &[(&str, &str)] = &[
        ("args.cents >", "CEL does not compile: Syntax error"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("cents > 1", "unknown variable 'cents' (available: args)"),
        ("tool == 'x'", "unknown variable 'tool' (available: args)"),
    ];
    for (expr, needle) in cases {
        let error = compile_predicate(expr).unwrap_err();
        assert!(error.contains(needle), "{expr:?}: {error}");
    }
}

#[test]
fn predicate_allows_comprehension_variables_and_type_names() {
    let predicate = compile_predicate("args.items.all(x, type(x) == int && x > 0)").unwrap();
    assert_eq!(predicate.eval(&json!({"items": [1, 2]})), Ok(true));
    assert_eq!(predicate.eval(&json!({"items": [1, -2]})), Ok(false));
}

// ---- files that fail to load ---------------------------------------------------------------

#[test]
fn refused_files_name_line_and_reason() {
    let cases: &[(&str, usize, &str)] = &[
        ("default: allow\nallow_lists: [a]\n", 2, "unknown field `allow_lists`"),
        (
            "rules:\n  - id: r\n    decision: allow\n    priorty: 3\n",
            4,
            "rules[0]: unknown field `priorty`",
        ),
        (
            "rules:\n  - id: r\n    match:\n      tool: [a]\n    decision: allow\n",
            4,
            "rules[0].match: unknown field `tool`",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval:\n      timout: 5m\n",
            5,
            "unknown field `timout`",
        ),
        (
            "default: maybe\n",
            1,
            "unknown default 'maybe' (expected allow or deny)",
        ),
        (
            "rules:\n  - id: r\n    decision: maybe\n",
            3,
            "rules[0].decision: unknown decision 'maybe' (expected allow, deny or approve)",
        ),
        (
            "max_risk: { ceiling: extreme }\n",
            1,
            "unknown risk level 'extreme' (expected low, medium, high or critical)",
        ),
        (
            "rules:\n  - id: r\n    match:\n      risk: [high, severe]\n    decision: allow\n",
            4,
            "rules[0].match.risk[1]: unknown risk level 'severe'",
        ),
        (
            "max_risk:\n  ceiling: medium\n  approve_above: high\n",
            2,
            "approve_above (high) is above the ceiling (medium)",
        ),
        (
            "max_risk: {}\n",
            1,
            "max_risk needs a ceiling, an approve_above, or both",
        ),
        (
            "rules:\n  - id: ok\n    decision: allow\n  - id: r\n    decision: deny\n",
            4,
            "rules[1]: rule 'r' denies without a reason",
        ),
        (
            "rules:\n  - id: r\n    decision: deny\n    reason: '  '\n",
            2,
            "rule 'r' denies without a reason",
        ),
        (
            "rules:\n  - id: a\n    decision: allow\n  - id: b\n    decision: allow\n  - id: a\n    decision: allow\n",
            6,
            "rules[2]: duplicate rule id 'a' (rules[0] has it already)",
        ),
        ("rules:\n  - id: ''\n    decision: allow\n", 2, "rule id is empty"),
        (
            "allow_list: [add, 'read_[a']\n",
            1,
            "allow_list[1]: invalid glob 'read_[a'",
        ),
        (
            "rules:\n  - id: r\n    match:\n      tools:\n        - ok\n        - ''\n    decision: allow\n",
            6,
            "rules[0].match.tools[1]: empty glob",
        ),
        (
            "rules:\n  - id: r\n    match:\n      agents: []\n    decision: allow\n",
            4,
            "rules[0].match.agents: empty list",
        ),
        ("allow_list: []\n", 1, "allow_list: empty list"),
        (
            "rules:\n  - id: r\n    match:\n      when: \"args.cents >\"\n    decision: allow\n",
            4,
            "rules[0].match.when: CEL does not compile: Syntax error",
        ),
        (
            "rules:\n  - id: r\n    match:\n      when: \"arg.cents > 1\"\n    decision: allow\n",
            4,
            "unknown variable 'arg' (available: tool, args, run, resources)",
        ),
        (
            "rules:\n  - id: r\n    match:\n      when: \"\"\n    decision: deny\n    reason: x\n",
            4,
            "empty expression",
        ),
        (
            "rules:\n  - id: r\n    match:\n      when:\n    decision: deny\n    reason: x\n",
            4,
            "empty `when`",
        ),
        (
            "rules:\n  - id: r\n    decision: deny\n    reason: x\n    approval: { timeout: 5m }\n",
            2,
            "rule 'r' has an `approval` block but decides deny",
        ),
        (
            "rules:\n  - id: r\n    decision: allow\n    approval: {}\n",
            2,
            "rule 'r' has an `approval` block but decides allow",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval:\n      timeout: 5 minutes\n",
            5,
            "bad duration '5 minutes'",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval: { timeout: 0s }\n",
            4,
            "bad duration '0s': a timeout must be positive",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval: { timeout: -3 }\n",
            4,
            "a timeout must be positive",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval: { timeout: 1.5 }\n",
            4,
            "write whole seconds",
        ),
        (
            "rules:\n  - id: r\n    decision: approve\n    approval: { approvers: [''] }\n",
            2,
            "rule 'r' names an empty approver",
        ),
        (
            "rules:\n  - id: r\n    match: { read_only: true, writes: true }\n    decision: allow\n",
            2,
            "read_only: true and writes: true",
        ),
        ("rules:\n  - decision: allow\n", 2, "rules[0]: missing field `id`"),
        ("rules:\n  - id: r\n", 2, "missing field `decision`"),
        (
            "require_permissions: yes\n",
            1,
            "require_permissions: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "default: allow\nrules:\n  - id: a\n    decision: allow\n  bad\n",
            5,
            "could not find expected ':'",
        ),
        (
            "rules:\n  - id: r\n    match:\n      when: 42\n    decision: allow\n",
            4,
            "a constant that is not a bool",
        ),
        (
            "rules:\n  - id: r\n    match:\n      tools: refund\n    decision: allow\n",
            4,
            "rules[0].match.tools: invalid type: string \"refund\", expected a list",
        ),
        ("- a\n- b\n", 1, "expected a policy"),
    ];
    for (yaml, line, needle) in cases {
        assert_refused(yaml, *line, needle);
    }
}

#[test]
fn refused_error_displays_file_and_line() {
    let error = refused("default: allow\nallow_lists: [a]\n");
    let text = error.to_string();
    assert!(text.starts_with("policy line 2: unknown field `allow_lists`"), "{text}");
}

#[test]
fn an_empty_file_is_refused() {
    for text in ["", "\n  \n", "# only a comment\n", "---\n"] {
        let error = refused(text);
        assert_eq!(error.line, None);
        assert!(error.reason.contains("the policy file is empty"), "{text:?}: {error}");
    }
}

#[test]
fn durations_in_every_unit() {
    let cases: &[(&str, u64)] = &[
        ("250ms", 250),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("90", 90_000),
        ("'90'", 90_000),
    ];
    for (text, ms) in cases {
        let yaml = format!("rules:\n  - id: r\n    decision: approve\n    approval: {{ timeout: {text} }}\n");
        assert_eq!(approval(&decide(&yaml, &call("t"))).0, Some(*ms), "{text}");
    }
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, "default: deny\nrules:\n  - id: r\n    decision: deny\n").unwrap();
    let error = Policy::load(&path).unwrap_err();
    assert_eq!(error.path.as_deref(), Some(path.as_path()));
    assert_eq!(
        error.to_string(),
        format!(
            "{} line 3: rules[0]: rule 'r' denies without a reason; add `reason`, which the model reads after `not \
             allowed.`",
            path.display()
        )
    );

    let missing = Policy::load(&dir.path().join("absent.yaml")).unwrap_err();
    assert_eq!(missing.line, None);
    assert!(missing.to_string().contains("absent.yaml: cannot read: "), "{missing}");

    std::fs::write(&path, "default: deny\n").unwrap();
    let loaded = Policy::load(&path).unwrap();
    assert_eq!(outcome(&loaded.decide(&call("t").facts())), ("deny", "default:deny"));
}

#[test]
fn the_documented_example_loads() {
    let yaml = "
# presets, combined with the rules so that the strictest answer wins
default: allow
allow_list: [add, 'read_*', 'refund*']
deny_list: ['rm_*']
max_risk: { ceiling: high, approve_above: medium }
require_permissions: true
rules:
  - id: no-big-refunds
    priority: 10
    match:
      tools: ['refund*']
      agents: ['billing-*']
      risk: [high, critical]
      read_only: false
      writes: true
      when: \"args.cents > 10000 && run.labels.env == 'prod'\"
    decision: approve
    reason: refunds over $100 need a person
    approval: { timeout: 3600s, approvers: [payments-oncall], message: check the ticket }
";
    let p = policy(yaml);
    assert_eq!(p.rule_count(), 1);
    let c = call("refund")
        .risk(Risk::High)
        .writes()
        .agent("billing-bot")
        .args(json!({"cents": 50000}))
        .label("env", "prod")
        .needs(&["billing:write"])
        .granted(&["billing:write"]);
    let decision = p.decide(&c.facts());
    assert_eq!(decision.decided_by, "preset:max_risk");
    assert_eq!(
        approval(&decision),
        (
            Some(3_600_000),
            vec!["payments-oncall".to_owned()],
            Some("risk high is above medium, so a person must approve; check the ticket".to_owned())
        )
    );
}

#[test]
fn risk_parses_and_orders() {
    assert_eq!("high".parse::<Risk>(), Ok(Risk::High));
    assert!("High".parse::<Risk>().is_err());
    assert!(Risk::Low < Risk::Medium && Risk::Medium < Risk::High && Risk::High < Risk::Critical);
    assert_eq!(Risk::from(crate::model::RiskLevel::Critical), Risk::Critical);
}

// ---- the table of keys ---------------------------------------------------------------------

/// A one-line policy file that writes `key: value` in the mapping of `section`, inside a rule
/// that asks a person (which takes every rule key, `approval` and `reason` included).
fn file_with(section: keys::Section, key: &str, value: &str) -> String {
    use keys::Section;
    let rule = |inner: &str| format!("rules: [{{ id: r, decision: approve, {inner} }}]\n");
    match section {
        Section::File => format!("{key}: {value}\n"),
        Section::MaxRisk => format!("max_risk: {{ {key}: {value} }}\n"),
        Section::Rule => {
            let others: Vec<String> = [("id", "r"), ("decision", "approve")]
                .into_iter()
                .filter(|(name, _)| *name != key)
                .map(|(name, base)| format!("{name}: {base}"))
                .collect();
            format!("rules: [{{ {}, {key}: {value} }}]\n", others.join(", "))
        }
        Section::Match => rule(&format!("match: {{ {key}: {value} }}")),
        Section::Approval => rule(&format!("approval: {{ {key}: {value} }}")),
        // A budget limits something: the key alone when it is a limit, else beside one.
        Section::Budget if key == "max_cost" => format!("budgets: [{{ {key}: {value} }}]\n"),
        Section::Budget => format!("budgets: [{{ max_cost: 1.0, {key}: {value} }}]\n"),
        // A limit names its tools and bounds a rate (which a burst needs).
        Section::Limit if key == "tools" => format!("limits: [{{ at_once: 1, {key}: {value} }}]\n"),
        Section::Limit if key == "per_second" => format!("limits: [{{ tools: t, {key}: {value} }}]\n"),
        Section::Limit => format!("limits: [{{ tools: t, per_second: 1, {key}: {value} }}]\n"),
        Section::FairShares if key == "label" => format!("fair_shares: {{ {key}: {value} }}\n"),
        Section::FairShares => format!("fair_shares: {{ label: tenant, {key}: {value} }}\n"),
    }
}

#[test]
fn the_table_lists_exactly_the_fields_the_parser_reads() {
    for section in keys::Section::ALL {
        let mut listed: Vec<&str> = section.keys().map(|key| key.name).collect();
        let mut read = file::derived_fields(section).to_vec();
        listed.sort_unstable();
        read.sort_unstable();
        assert_eq!(listed, read, "the keys of {} in policy/keys.rs", section.path());
    }
}

#[test]
fn every_key_of_the_table_loads_with_its_example() {
    for key in keys::KEYS {
        let text = file_with(key.section, key.name, key.example);
        if let Err(error) = Policy::from_yaml(&text) {
            panic!(
                "{} `{}` with its example: {error}\n{text}",
                key.section.path(),
                key.name
            );
        }
    }
}

#[test]
fn a_key_the_table_does_not_list_is_refused_in_every_section() {
    for section in keys::Section::ALL {
        let text = file_with(section, "colour", "1");
        let error = refused(&text);
        assert!(
            error.reason.contains("unknown field `colour`, expected one of"),
            "{}: {error}\n{text}",
            section.path()
        );
    }
}

#[test]
fn the_example_of_the_reference_page_loads() {
    let policy = Policy::from_yaml(keys::EXAMPLE).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(policy.rule_count(), 4);
}

#[test]
fn limits_and_fair_shares_that_cannot_hold_are_refused_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "limits:\n  - tools: a\n    at_once: 1\n  - tools: a\n    per_second: 2\n",
            "limits[1].tools: 'a' is named by limits[0] already",
        ),
        (
            "limits:\n  - tools: \"tool:charge\"\n    at_once: 1\n",
            "limits[0].tools: no tool name holds ':'",
        ),
        (
            "limits:\n  - tools: a\n",
            "limits[0]: a limit sets per_second, at_once or both",
        ),
        (
            "fair_shares:\n  label: \" \"\n",
            "fair_shares.label: name the run label",
        ),
        (
            "fair_shares:\n  label: tenant\n  weights: { acme: 0 }\n",
            "fair_shares.weights.acme: 0 is not a weight; a share weighs 1 to 1000",
        ),
        (
            "fair_shares:\n  label: tenant\n  weights: { acme: 1001 }\n",
            "fair_shares.weights.acme: 1001 is not a weight",
        ),
    ];
    for (yaml, needle) in cases {
        let error = refused(yaml).to_string();
        assert!(error.contains(needle), "{error}\n{yaml}");
    }
}
