//! Parsing and validating a policy file.
//!
//! Validation happens inside the deserializer, node by node, so every error carries the line of
//! the YAML node it is about: a bad scalar (risk, decision, glob, CEL, duration) is reported at
//! its own line, a rule-level problem (a deny without a reason, a duplicate id, an `approval`
//! block on a rule that does not ask) at the line where the rule starts.
//!
//! Each mapping's keys are checked against the table of [`keys`](super::keys) before serde reads
//! them, so the parser accepts exactly the keys the reference page lists.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::cel::Condition;
use super::glob::{self, GlobList};
use super::keys::Section;
use super::presets::{MaxRisk, Presets};
use super::rules::{Matcher, Rule};
use super::{Compiled, Fallback, PolicyError, Risk, Verdict};

/// Parses, validates and compiles a policy file's text.
pub(super) fn parse(text: &str) -> Result<Compiled, PolicyError> {
    let blank = text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---"
    });
    if blank {
        return Err(PolicyError::new(
            None,
            "the policy file is empty; write `default: allow` or `default: deny` for a policy without rules",
        ));
    }
    let Keyed(file) = serde_norway::from_str::<Keyed<PolicyFile>>(text).map_err(|e| yaml_error(e, text))?;
    let mut rules = file.rules.0;
    // Stable: rules of equal priority keep their file order.
    rules.sort_by_key(|rule| std::cmp::Reverse(rule.priority));
    Ok(Compiled {
        fallback: file.default,
        presets: Presets {
            allow_list: file.allow_list.map(|g| g.0),
            deny_list: file.deny_list.map(|g| g.0),
            max_risk: file.max_risk.map(|m| m.0),
            require_permissions: file.require_permissions,
        },
        rules,
        budgets: file
            .budgets
            .into_iter()
            .enumerate()
            .map(|(index, Keyed(raw))| build_budget(raw, index))
            .collect::<Result<_, _>>()?,
        limits: build_limits(file.limits)?,
        fair_shares: file.fair_shares.map(|Keyed(raw)| build_shares(raw)).transpose()?,
    })
}

/// The file's fair shares: a label, and weights each a whole number of shares.
fn build_shares(raw: RawFairShares) -> Result<super::FairShares, PolicyError> {
    if raw.label.trim().is_empty() {
        return Err(PolicyError::new(
            None,
            "fair_shares.label: name the run label whose value is a run's share, such as `tenant`",
        ));
    }
    let weights = raw.weights.unwrap_or_default();
    if let Some((value, weight)) = weights.iter().find(|(_, weight)| !(1..=MAX_WEIGHT).contains(*weight)) {
        return Err(PolicyError::new(
            None,
            format!("fair_shares.weights.{value}: {weight} is not a weight; a share weighs 1 to {MAX_WEIGHT}"),
        ));
    }
    Ok(super::FairShares {
        label: raw.label,
        weights,
    })
}

/// The heaviest share: a thousand to one is as unequal as shares get.
const MAX_WEIGHT: u32 = 1000;

/// The file's tool limits, each checked as [`crate::machine::throttle::ToolLimit::check`] says;
/// two may not name the same tools, whose state they would share.
fn build_limits(raw: Vec<Keyed<RawLimit>>) -> Result<Vec<super::PolicyLimit>, PolicyError> {
    let mut limits: Vec<super::PolicyLimit> = Vec::with_capacity(raw.len());
    for (index, Keyed(raw)) in raw.into_iter().enumerate() {
        let limit = crate::machine::throttle::ToolLimit {
            tools: raw.tools.0.glob().to_owned(),
            per_second: raw.per_second,
            burst: raw.burst,
            at_once: raw.at_once,
        };
        limit
            .check()
            .map_err(|(field, why)| PolicyError::new(None, format!("limits[{index}]{field}: {why}")))?;
        if limit.tools.contains(':') {
            return Err(PolicyError::new(
                None,
                format!(
                    "limits[{index}].tools: no tool name holds ':' (`{}<name>` names the limit a tool declares itself)",
                    crate::machine::throttle::DECLARED
                ),
            ));
        }
        if let Some(first) = limits.iter().position(|other| other.limit.tools == limit.tools) {
            return Err(PolicyError::new(
                None,
                format!(
                    "limits[{index}].tools: '{}' is named by limits[{first}] already; write one limit per glob",
                    limit.tools
                ),
            ));
        }
        limits.push(super::PolicyLimit {
            matcher: raw.tools.0.compile_matcher(),
            limit,
        });
    }
    Ok(limits)
}

/// A budget of the file, checked as a request's is ([`crate::machine::budget::Limit::check`]).
fn build_budget(raw: RawBudget, index: usize) -> Result<super::PolicyBudget, PolicyError> {
    let ask = match raw.approval {
        Some(Keyed(approval)) => {
            if approval.approvers.iter().any(|a| a.trim().is_empty()) {
                return Err(PolicyError::new(
                    None,
                    format!("budgets[{index}].approval.approvers: names an empty approver"),
                ));
            }
            Some(crate::machine::budget::Ask {
                approvers: approval.approvers,
                timeout_ms: approval.timeout.map(|t| t.0),
                message: approval.message.filter(|m| !m.trim().is_empty()),
            })
        }
        None => None,
    };
    let limit = crate::machine::budget::Limit {
        tools: raw.tools.map(|pattern| pattern.0.glob().to_owned()),
        max_calls: raw.max_calls,
        max_cost: raw.max_cost,
        max_time_ms: raw.max_time.map(|t| t.0),
        set_by: Some(format!("policy:budgets[{index}]")),
        spent: Default::default(),
        ask,
    };
    limit
        .check()
        .map_err(|(field, why)| PolicyError::new(None, format!("budgets[{index}]{field}: {why}")))?;
    Ok(super::PolicyBudget {
        labels: raw.labels.unwrap_or_default(),
        agents: raw.agents.map(|globs| globs.0),
        limit,
    })
}

/// The error's line, and its message without the trailing "at line L column C" that the
/// line already says. The message keeps serde_norway's path, such as `rules[1].match: `.
fn yaml_error(error: serde_norway::Error, text: &str) -> PolicyError {
    let location = error.location();
    let mut reason = error.to_string();
    if let Some(location) = &location {
        let at = format!(" at line {} column {}", location.line(), location.column());
        reason = reason.replacen(&at, "", 1);
    }
    // A file cut short fails at its end, which libyaml counts as the line after the last.
    let last_line = text.lines().count().max(1);
    PolicyError::new(location.map(|l| l.line().min(last_line)), reason)
}

// Each mapping's keys were checked against the table already; `deny_unknown_fields` refuses a
// key the table lists but no struct reads, so the two cannot drift apart silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    default: Fallback,
    #[serde(default)]
    allow_list: Option<Globs>,
    #[serde(default)]
    deny_list: Option<Globs>,
    #[serde(default)]
    max_risk: Option<MaxRiskField>,
    #[serde(default)]
    require_permissions: bool,
    #[serde(default)]
    rules: Rules,
    #[serde(default)]
    budgets: Vec<Keyed<RawBudget>>,
    #[serde(default)]
    limits: Vec<Keyed<RawLimit>>,
    #[serde(default)]
    fair_shares: Option<Keyed<RawFairShares>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFairShares {
    label: String,
    #[serde(default)]
    weights: Option<std::collections::BTreeMap<String, u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    tools: Pattern,
    #[serde(default)]
    per_second: Option<f64>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    at_once: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    #[serde(default)]
    labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    agents: Option<Globs>,
    #[serde(default)]
    tools: Option<Pattern>,
    #[serde(default)]
    max_calls: Option<u64>,
    #[serde(default)]
    max_cost: Option<f64>,
    #[serde(default)]
    max_time: Option<Timeout>,
    #[serde(default)]
    approval: Option<Keyed<RawApproval>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    #[serde(default)]
    priority: i64,
    #[serde(default, rename = "match")]
    matcher: Option<Keyed<RawMatch>>,
    decision: DecisionKind,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    approval: Option<Keyed<RawApproval>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    #[serde(default)]
    tools: Option<Globs>,
    #[serde(default)]
    agents: Option<Globs>,
    #[serde(default)]
    risk: Option<NonEmpty<Risk>>,
    #[serde(default)]
    read_only: Option<bool>,
    #[serde(default)]
    writes: Option<bool>,
    #[serde(default)]
    resources: Option<Globs>,
    #[serde(default, deserialize_with = "when")]
    when: Option<Condition>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApproval {
    #[serde(default)]
    timeout: Option<Timeout>,
    #[serde(default)]
    approvers: Vec<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMaxRisk {
    #[serde(default)]
    ceiling: Option<Risk>,
    #[serde(default)]
    approve_above: Option<Risk>,
}

/// A mapping of a policy file, whose keys are those of one section of the table.
trait Mapping {
    /// The section of the table that lists its keys.
    const SECTION: Section;
}

impl Mapping for PolicyFile {
    const SECTION: Section = Section::File;
}

impl Mapping for RawMaxRisk {
    const SECTION: Section = Section::MaxRisk;
}

impl Mapping for RawRule {
    const SECTION: Section = Section::Rule;
}

impl Mapping for RawMatch {
    const SECTION: Section = Section::Match;
}

impl Mapping for RawApproval {
    const SECTION: Section = Section::Approval;
}

impl Mapping for RawBudget {
    const SECTION: Section = Section::Budget;
}

impl Mapping for RawLimit {
    const SECTION: Section = Section::Limit;
}

impl Mapping for RawFairShares {
    const SECTION: Section = Section::FairShares;
}

/// `T` read from a mapping whose keys were checked against its section of the table.
struct Keyed<T>(T);

impl<'de, T: Deserialize<'de> + Mapping> Deserialize<'de> for Keyed<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyedVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Mapping> Visitor<'de> for KeyedVisitor<T> {
            type Value = Keyed<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&T::SECTION.expecting())
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Keyed<T>, A::Error> {
                read_keyed(map).map(Keyed)
            }
        }

        deserializer.deserialize_map(KeyedVisitor(PhantomData))
    }
}

/// Reads `T` from `map`, refusing a key its section of the table does not list.
fn read_keyed<'de, T: Deserialize<'de> + Mapping, A: MapAccess<'de>>(map: A) -> Result<T, A::Error> {
    T::deserialize(MapAccessDeserializer::new(KnownKeys {
        map,
        section: T::SECTION,
    }))
}

/// A mapping that refuses, where it is read, a key its section of the table does not list.
struct KnownKeys<A> {
    map: A,
    section: Section,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for KnownKeys<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.map.next_key_seed(KnownKey {
            section: self.section,
            seed,
        })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// One key, checked while the YAML parser reads it, so that a refusal names the key's line rather
/// than the mapping's.
struct KnownKey<K> {
    section: Section,
    seed: K,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for KnownKey<K> {
    type Value = K::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<K::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for KnownKey<K> {
    type Value = K::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<K::Value, E> {
        if !self.section.knows(key) {
            return Err(E::custom(self.section.unknown(key)));
        }
        self.seed.deserialize(de::value::StrDeserializer::new(key))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecisionKind {
    Allow,
    Deny,
    Approve,
}

impl DecisionKind {
    fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Allow => "allow",
            DecisionKind::Deny => "deny",
            DecisionKind::Approve => "approve",
        }
    }
}

/// Deserializes a scalar through `parse`, so that a value it refuses is reported at the line of
/// that value.
fn scalar<'de, D, T>(
    deserializer: D,
    expecting: &'static str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct ScalarVisitor<T> {
        expecting: &'static str,
        parse: fn(&str) -> Result<T, String>,
    }

    impl<T> Visitor<'_> for ScalarVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<T, E> {
            (self.parse)(value).map_err(E::custom)
        }
    }

    deserializer.deserialize_str(ScalarVisitor { expecting, parse })
}

impl<'de> Deserialize<'de> for Risk {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        scalar(deserializer, "a risk level: low, medium, high or critical", str::parse)
    }
}

impl<'de> Deserialize<'de> for Fallback {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        scalar(deserializer, "allow or deny", |text| match text {
            "allow" => Ok(Fallback::Allow),
            "deny" => Ok(Fallback::Deny),
            other => Err(format!("unknown default '{other}' (expected allow or deny)")),
        })
    }
}

impl<'de> Deserialize<'de> for DecisionKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        scalar(deserializer, "a decision: allow, deny or approve", |text| match text {
            "allow" => Ok(DecisionKind::Allow),
            "deny" => Ok(DecisionKind::Deny),
            "approve" => Ok(DecisionKind::Approve),
            other => Err(format!("unknown decision '{other}' (expected allow, deny or approve)")),
        })
    }
}

/// A `when` condition; present but null or blank is refused, since an empty predicate must not
/// silently match nothing (or everything).
fn when<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Condition>, D::Error> {
    struct WhenVisitor;

    impl<'de> Visitor<'de> for WhenVisitor {
        type Value = Condition;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a CEL expression")
        }

        fn visit_none<E: de::Error>(self) -> Result<Condition, E> {
            Err(E::custom(
                "empty `when`: it would never match; remove the key or write a condition",
            ))
        }

        fn visit_unit<E: de::Error>(self) -> Result<Condition, E> {
            self.visit_none()
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Condition, D::Error> {
            scalar(deserializer, "a CEL expression", Condition::compile)
        }
    }

    deserializer.deserialize_option(WhenVisitor).map(Some)
}

/// A list that must not be empty: an empty matcher list would silently match nothing.
struct NonEmpty<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for NonEmpty<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
            type Value = NonEmpty<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list such as [a, b]")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                if items.is_empty() {
                    return Err(de::Error::custom(
                        "empty list: it would match nothing; remove the key instead",
                    ));
                }
                Ok(NonEmpty(items))
            }
        }

        deserializer.deserialize_seq(ListVisitor(PhantomData))
    }
}

/// One glob, compiled where it is read.
struct Pattern(globset::Glob);

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        scalar(deserializer, "a glob such as \"read_*\"", glob::compile).map(Pattern)
    }
}

/// A non-empty list of globs.
struct Globs(GlobList);

impl<'de> Deserialize<'de> for Globs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let NonEmpty(patterns) = NonEmpty::<Pattern>::deserialize(deserializer)?;
        GlobList::new(patterns.into_iter().map(|p| p.0).collect())
            .map(Globs)
            .map_err(de::Error::custom)
    }
}

/// A duration in milliseconds (an approval's timeout, a budget's time): `250ms`, `30s`, `5m`, `1h`, or whole seconds.
struct Timeout(u64);

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TimeoutVisitor;

        impl Visitor<'_> for TimeoutVisitor {
            type Value = Timeout;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 30s, 5m, 1h, 250ms, or whole seconds")
            }

            fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Timeout, E> {
                parse_duration(&seconds.to_string()).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Timeout, E> {
                match u64::try_from(seconds) {
                    Ok(seconds) => self.visit_u64(seconds),
                    Err(_) => Err(E::custom(format!(
                        "bad duration '{seconds}': a timeout must be positive"
                    ))),
                }
            }

            fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Timeout, E> {
                Err(E::custom(format!(
                    "bad duration '{seconds}': write whole seconds or a unit, such as 1500ms"
                )))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Timeout, E> {
                parse_duration(text).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(TimeoutVisitor)
    }
}

fn parse_duration(text: &str) -> Result<Timeout, String> {
    match kernel_proto::duration::parse_millis(text)? {
        0 => Err(format!("bad duration '{text}': a timeout must be positive")),
        ms => Ok(Timeout(ms)),
    }
}

/// `max_risk`, checked where it is written: `approve_above` must not exceed the ceiling.
struct MaxRiskField(MaxRisk);

impl<'de> Deserialize<'de> for MaxRiskField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MaxRiskVisitor;

        impl<'de> Visitor<'de> for MaxRiskVisitor {
            type Value = MaxRiskField;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a mapping with ceiling and approve_above, such as { ceiling: high, approve_above: medium }",
                )
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MaxRiskField, A::Error> {
                let raw: RawMaxRisk = read_keyed(map)?;
                match (raw.ceiling, raw.approve_above) {
                    (None, None) => Err(de::Error::custom("max_risk needs a ceiling, an approve_above, or both")),
                    (Some(ceiling), Some(above)) if above > ceiling => Err(de::Error::custom(format!(
                        "approve_above ({above}) is above the ceiling ({ceiling}): calls above the ceiling are \
                         denied, so approve_above must be at most the ceiling"
                    ))),
                    (ceiling, approve_above) => Ok(MaxRiskField(MaxRisk {
                        ceiling: ceiling.unwrap_or(Risk::Critical),
                        approve_above,
                    })),
                }
            }
        }

        deserializer.deserialize_map(MaxRiskVisitor)
    }
}

/// The rules in file order, each validated where it starts; ids are unique.
#[derive(Default)]
struct Rules(Vec<Rule>);

impl<'de> Deserialize<'de> for Rules {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RulesVisitor;

        impl<'de> Visitor<'de> for RulesVisitor {
            type Value = Rules;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of rules")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Rules, A::Error> {
                let mut seen = HashMap::new();
                let mut rules = Vec::new();
                while let Some(rule) = seq.next_element_seed(RuleSeed {
                    seen: &mut seen,
                    index: rules.len(),
                })? {
                    rules.push(rule);
                }
                Ok(Rules(rules))
            }
        }

        deserializer.deserialize_seq(RulesVisitor)
    }
}

/// Deserializes one rule, knowing the ids of the rules before it.
struct RuleSeed<'s> {
    seen: &'s mut HashMap<String, usize>,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for RuleSeed<'_> {
    type Value = Rule;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Rule, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RuleSeed<'_> {
    type Value = Rule;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Section::Rule.expecting())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Rule, A::Error> {
        let raw: RawRule = read_keyed(map)?;
        build_rule(raw, self.seen, self.index).map_err(de::Error::custom)
    }
}

fn build_rule(raw: RawRule, seen: &mut HashMap<String, usize>, index: usize) -> Result<Rule, String> {
    let id = raw.id;
    if id.trim().is_empty() {
        return Err("rule id is empty; decisions record it as rule:<id>".to_owned());
    }
    if let Some(first) = seen.get(&id) {
        return Err(format!(
            "duplicate rule id '{id}' (rules[{first}] has it already); ids must be unique because decisions \
             record them"
        ));
    }
    seen.insert(id.clone(), index);

    let reason = raw.reason.filter(|r| !r.trim().is_empty());
    let approval = raw.approval.map(|Keyed(approval)| approval);
    if approval.is_some() && raw.decision != DecisionKind::Approve {
        return Err(format!(
            "rule '{id}' has an `approval` block but decides {}; `approval` applies only to `decision: approve`",
            raw.decision.as_str()
        ));
    }
    let outcome = match raw.decision {
        DecisionKind::Allow => Verdict::Allow,
        DecisionKind::Deny => Verdict::Deny {
            reason: reason.ok_or_else(|| {
                format!("rule '{id}' denies without a reason; add `reason`, which the model reads after `not allowed.`")
            })?,
        },
        DecisionKind::Approve => {
            let approval = approval.unwrap_or(RawApproval {
                timeout: None,
                approvers: Vec::new(),
                message: None,
            });
            if approval.approvers.iter().any(|a| a.trim().is_empty()) {
                return Err(format!("rule '{id}' names an empty approver"));
            }
            Verdict::Approve {
                timeout_ms: approval.timeout.map(|t| t.0),
                approvers: approval.approvers,
                message: approval.message.filter(|m| !m.trim().is_empty()).or(reason),
            }
        }
    };

    let matcher = match raw.matcher {
        None => Matcher::default(),
        Some(Keyed(m)) => {
            if m.read_only == Some(true) && m.writes == Some(true) {
                return Err(format!(
                    "rule '{id}' matches read_only: true and writes: true, which no tool can be; it would never match"
                ));
            }
            Matcher {
                tools: m.tools.map(|g| g.0),
                agents: m.agents.map(|g| g.0),
                risk: m.risk.map(|r| r.0),
                read_only: m.read_only,
                writes: m.writes,
                resources: m.resources.map(|g| g.0),
                when: m.when,
            }
        }
    };

    Ok(Rule {
        id,
        priority: raw.priority,
        matcher,
        outcome,
    })
}

/// The fields serde's derive reads for the mapping of `section`, for the test that compares them
/// with the table.
#[cfg(test)]
pub(super) fn derived_fields(section: Section) -> &'static [&'static str] {
    match section {
        Section::File => introspect::fields::<PolicyFile>(),
        Section::MaxRisk => introspect::fields::<RawMaxRisk>(),
        Section::Rule => introspect::fields::<RawRule>(),
        Section::Match => introspect::fields::<RawMatch>(),
        Section::Approval => introspect::fields::<RawApproval>(),
        Section::Budget => introspect::fields::<RawBudget>(),
        Section::Limit => introspect::fields::<RawLimit>(),
        Section::FairShares => introspect::fields::<RawFairShares>(),
    }
}

/// Serde's derive hands a struct's field names to `deserialize_struct`; this deserializer keeps
/// them and refuses to go further.
#[cfg(test)]
mod introspect {
    use std::cell::Cell;

    use serde::de::{self, Deserialize, Deserializer, Visitor};

    #[derive(Debug)]
    struct Stop;

    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("introspected")
        }
    }

    impl std::error::Error for Stop {}

    impl de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    struct Fields<'a>(&'a Cell<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for Fields<'_> {
        type Error = Stop;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0.set(fields);
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    /// The field names `T`'s derived `Deserialize` reads.
    pub(super) fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        let found = Cell::new(&[][..]);
        let _ = T::deserialize(Fields(&found));
        found.get()
    }
}
