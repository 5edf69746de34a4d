//! Every key a policy file may hold, in one table.
//!
//! The parser checks each key of a mapping against this table before serde sees it, and the
//! reference page `docs/reference/policy-file.md` is rendered from it, so a key cannot be
//! accepted without being documented. The tests check the other direction: every key listed here
//! is a field the parser reads, and a file using it (its `example`) loads.

/// Where in a policy file a key may appear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    /// The top level of the file.
    File,
    /// The `max_risk` mapping.
    MaxRisk,
    /// One rule of the `rules` list.
    Rule,
    /// A rule's `match` mapping.
    Match,
    /// A rule's `approval` mapping.
    Approval,
    /// One budget of the `budgets` list.
    Budget,
    /// One limit of the `limits` list.
    Limit,
    /// The `fair_shares` mapping.
    FairShares,
}

impl Section {
    /// Every section, in the order the reference page lists them.
    #[cfg(test)]
    pub(crate) const ALL: [Section; 8] = [
        Section::File,
        Section::MaxRisk,
        Section::Rule,
        Section::Match,
        Section::Approval,
        Section::Budget,
        Section::Limit,
        Section::FairShares,
    ];

    /// The section as a path into the file, as the reference page names it.
    #[cfg(test)]
    pub(crate) fn path(self) -> &'static str {
        match self {
            Section::File => "top level",
            Section::MaxRisk => "max_risk",
            Section::Rule => "rules[]",
            Section::Match => "rules[].match",
            Section::Approval => "rules[].approval, budgets[].approval",
            Section::Budget => "budgets[]",
            Section::Limit => "limits[]",
            Section::FairShares => "fair_shares",
        }
    }

    /// What a mapping of this section is, for an error that found something else there.
    fn what(self) -> &'static str {
        match self {
            Section::File => "a policy",
            Section::MaxRisk => "a max_risk",
            Section::Rule => "a rule",
            Section::Match => "a match",
            Section::Approval => "an approval",
            Section::Budget => "a budget",
            Section::Limit => "a limit",
            Section::FairShares => "a fair_shares",
        }
    }

    /// The keys of this section, in table order.
    pub(crate) fn keys(self) -> impl Iterator<Item = &'static Key> {
        KEYS.iter().filter(move |key| key.section == self)
    }

    /// Whether `name` is a key of this section.
    pub(crate) fn knows(self, name: &str) -> bool {
        self.keys().any(|key| key.name == name)
    }

    /// `a rule: a mapping with id, priority, ... and approval`.
    pub(crate) fn expecting(self) -> String {
        let names: Vec<&str> = self.keys().map(|key| key.name).collect();
        let listed = match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        format!("{}: a mapping with {listed}", self.what())
    }

    /// The refusal of a key this section does not have, worded as serde words its own.
    pub(crate) fn unknown(self, name: &str) -> String {
        let names: Vec<String> = self.keys().map(|key| format!("`{}`", key.name)).collect();
        format!("unknown field `{name}`, expected one of {}", names.join(", "))
    }
}

/// One key of a policy file.
#[derive(Debug)]
// The parser reads only the names; the rest is for the reference page, rendered by a test.
#[cfg_attr(not(test), expect(dead_code, reason = "read by the reference page's test"))]
pub(crate) struct Key {
    /// The key as written.
    pub(crate) name: &'static str,
    /// Where it may appear.
    pub(crate) section: Section,
    /// What it takes.
    pub(crate) value: &'static str,
    /// What an absent key means.
    pub(crate) default: &'static str,
    /// What it does.
    pub(crate) meaning: &'static str,
    /// A value it accepts, in YAML's flow style; the tests load a file using it.
    pub(crate) example: &'static str,
}

/// Every key, by section; the order of a section is the order of the page.
pub(crate) const KEYS: &[Key] = &[
    Key {
        name: "default",
        section: Section::File,
        value: "`allow` or `deny`",
        default: "`allow`",
        meaning: "What applies when no preset or rule allows or denies a call, recorded as `default:allow` or \
                  `default:deny`. An escalation alone (the `max_risk` approval band, a tool's own \
                  `requires_approval`) grants nothing, so under `deny` such a call is still denied.",
        example: "deny",
    },
    Key {
        name: "allow_list",
        section: Section::File,
        value: "list of tool-name globs",
        default: "off",
        meaning: "Allows a tool whose name matches an entry and denies every other tool (`preset:allow_list`).",
        example: "[\"add\", \"read_*\"]",
    },
    Key {
        name: "deny_list",
        section: Section::File,
        value: "list of tool-name globs",
        default: "off",
        meaning: "Denies a tool whose name matches an entry (`preset:deny_list`); `[\"*\"]` is a kill switch no \
                  rule overrides.",
        example: "[\"rm_*\"]",
    },
    Key {
        name: "max_risk",
        section: Section::File,
        value: "mapping of `ceiling` and `approve_above` (one or both)",
        default: "off",
        meaning: "Judges a call by its tool's declared risk (`preset:max_risk`); a tool that declares none counts \
                  as `low`. See its keys below.",
        example: "{ ceiling: high, approve_above: medium }",
    },
    Key {
        name: "require_permissions",
        section: Section::File,
        value: "`true` or `false`",
        default: "`false`",
        meaning: "Denies a call whose tool requires a permission (exact name) the run was not granted, naming the \
                  missing ones (`preset:require_permissions`).",
        example: "true",
    },
    Key {
        name: "rules",
        section: Section::File,
        value: "list of rules",
        default: "none",
        meaning: "Consulted by `priority`, higher first, ties in file order: the first rule whose matchers all \
                  hold contributes its decision (`rule:<id>`), later rules are not consulted.",
        example: "[{ id: adds, decision: allow }]",
    },
    Key {
        name: "budgets",
        section: Section::File,
        value: "list of budgets",
        default: "none",
        meaning: "What runs may spend on tool calls. Each budget whose matchers hold for a new run (subagents and \
                  branches among them) becomes a limit of its budget (`set_by: policy:budgets[<i>]`), beside those \
                  the run asks for: a run can tighten a budget, never loosen one. A call that would go past a limit \
                  does not run; the model reads why (`budget_exceeded`). See its keys below.",
        example: "[{ labels: { team: billing }, max_cost: 5.0 }]",
    },
    Key {
        name: "limits",
        section: Section::File,
        value: "list of limits",
        default: "none",
        meaning: "How fast and how many at once calls of some tools may start, counted across every worker, run \
                  and kernel replica. A call that finds no room waits in the queue (its schedule-to-start timeout \
                  still applies) rather than fail. A call of a tool several limits match passes each. See its keys \
                  below.",
        example: "[{ tools: \"payments_*\", per_second: 10, at_once: 4 }]",
    },
    Key {
        name: "fair_shares",
        section: Section::File,
        value: "mapping",
        default: "none: queued calls start in the order they came",
        meaning: "How queued calls share what is scarce (a tool limit's room, worker slots): by the value of a run \
                  label, each value served by its weight, so one tenant's burst cannot starve another's single \
                  call. A call takes its run's share when it is recorded. See its keys below.",
        example: "{ label: tenant, weights: { acme: 4 } }",
    },
    Key {
        name: "ceiling",
        section: Section::MaxRisk,
        value: "`low`, `medium`, `high` or `critical`",
        default: "`critical`",
        meaning: "A call whose tool's risk is above it is denied.",
        example: "high",
    },
    Key {
        name: "approve_above",
        section: Section::MaxRisk,
        value: "`low`, `medium`, `high` or `critical`, at most `ceiling`",
        default: "none",
        meaning: "A call whose tool's risk is above it (and not above the ceiling) asks a person first. It only \
                  escalates: under `default: deny` a call nothing else allows is still denied.",
        example: "medium",
    },
    Key {
        name: "id",
        section: Section::Rule,
        value: "non-blank string, unique in the file",
        default: "required",
        meaning: "Names the rule in the decisions it makes (`rule:<id>`).",
        example: "no-wipes",
    },
    Key {
        name: "priority",
        section: Section::Rule,
        value: "integer",
        default: "`0`",
        meaning: "Higher is consulted first; rules of equal priority keep their file order.",
        example: "10",
    },
    Key {
        name: "match",
        section: Section::Rule,
        value: "mapping of matchers",
        default: "any call",
        meaning: "Which calls the rule is about: every matcher present must hold, an absent one holds for any \
                  call. See its keys below.",
        example: "{ tools: [\"wipe*\"] }",
    },
    Key {
        name: "decision",
        section: Section::Rule,
        value: "`allow`, `deny` or `approve`",
        default: "required",
        meaning: "What the rule decides when it matches; `approve` allows the call once a person approves it.",
        example: "approve",
    },
    Key {
        name: "reason",
        section: Section::Rule,
        value: "string",
        default: "none",
        meaning: "Required (non-blank) with `deny`: the model reads it after `<tool> not allowed. reason:`. With \
                  `approve`, the message shown to the person when `approval` has no `message`.",
        example: "\"wiping is never automatic\"",
    },
    Key {
        name: "approval",
        section: Section::Rule,
        value: "mapping of `timeout`, `approvers` and `message`",
        default: "none",
        meaning: "How the person is asked; only with `decision: approve`. See its keys below.",
        example: "{ timeout: 1h }",
    },
    Key {
        name: "tools",
        section: Section::Match,
        value: "list of globs",
        default: "any tool",
        meaning: "The tool's name matches an entry.",
        example: "[\"refund*\"]",
    },
    Key {
        name: "agents",
        section: Section::Match,
        value: "list of globs",
        default: "any agent",
        meaning: "The run's agent matches an entry.",
        example: "[\"billing-*\"]",
    },
    Key {
        name: "risk",
        section: Section::Match,
        value: "list of `low`, `medium`, `high`, `critical`",
        default: "any risk",
        meaning: "The tool's declared risk is one of these; a tool that declares none counts as `low`.",
        example: "[high, critical]",
    },
    Key {
        name: "read_only",
        section: Section::Match,
        value: "`true` or `false`",
        default: "either",
        meaning: "The tool declares (`true`) or does not declare (`false`) that it only reads. `read_only: true` \
                  with `writes: true` is refused: no tool is both.",
        example: "false",
    },
    Key {
        name: "writes",
        section: Section::Match,
        value: "`true` or `false`",
        default: "either",
        meaning: "The tool declares (`true`) or does not declare (`false`) that it writes.",
        example: "true",
    },
    Key {
        name: "resources",
        section: Section::Match,
        value: "list of globs",
        default: "any call",
        meaning: "One of the call's resources, as filled from its arguments (`repo:acme/api`), or its kind alone \
                  (`repo`), matches an entry.",
        example: "[\"repo:prod-*\"]",
    },
    Key {
        name: "when",
        section: Section::Match,
        value: "CEL expression (a string)",
        default: "always",
        meaning: "Holds when the expression is true. It sees `tool` (string), `args` (the arguments), \
                  `run.agent` (string), `run.labels` (map of strings) and `resources` (list of strings); it must \
                  compile and name no other variable. One that fails to evaluate fails closed: a `deny` or \
                  `approve` rule matches, an `allow` rule denies.",
        example: "\"args.cents > 10000 && run.labels.env == 'prod'\"",
    },
    Key {
        name: "timeout",
        section: Section::Approval,
        value: "positive duration: `250ms`, `30s`, `5m`, `1h`, or whole seconds",
        default: "the tool's own `approval_timeout`, else none (a budget's: none)",
        meaning: "How long the person may take; expiry is a rejection (for a budget, the call settles as \
                  `budget_exceeded`). Where several contributions ask, the shortest timeout wins.",
        example: "1h",
    },
    Key {
        name: "approvers",
        section: Section::Approval,
        value: "list of non-blank names",
        default: "anyone who may answer approvals",
        meaning: "With an auth file, only a key of one of these names, or in one of these groups, may answer.",
        example: "[\"payments-oncall\"]",
    },
    Key {
        name: "message",
        section: Section::Approval,
        value: "string",
        default: "the rule's `reason` (a budget's: what the call would pass)",
        meaning: "Shown to the person asked; for a budget, before what the call would pass.",
        example: "\"check the ticket\"",
    },
    Key {
        name: "labels",
        section: Section::Budget,
        value: "mapping of label names to values",
        default: "any run",
        meaning: "The run has every one of these labels with these values.",
        example: "{ team: billing }",
    },
    Key {
        name: "agents",
        section: Section::Budget,
        value: "list of globs",
        default: "any agent",
        meaning: "The run's agent matches an entry.",
        example: "[\"billing-*\"]",
    },
    Key {
        name: "tools",
        section: Section::Budget,
        value: "glob",
        default: "every tool",
        meaning: "The limit counts only calls of tools whose name matches.",
        example: "\"payments_*\"",
    },
    Key {
        name: "max_calls",
        section: Section::Budget,
        value: "non-negative integer",
        default: "no limit on calls",
        meaning: "At most this many calls start (a call counts once, however many attempts it takes).",
        example: "100",
    },
    Key {
        name: "max_cost",
        section: Section::Budget,
        value: "non-negative number",
        default: "no limit on cost",
        meaning: "At most this much cost: each attempt's price (the tool's `cost_per_call`, else the kernel's \
                  `--unit-price` for its name) is charged as it starts. A budget sets at least one of `max_calls`, \
                  `max_cost` and `max_time`.",
        example: "5.0",
    },
    Key {
        name: "max_time",
        section: Section::Budget,
        value: "duration (`30s`, `10m`, `1h`, `250ms`, or whole seconds)",
        default: "no limit on time",
        meaning: "At most this much tool run time: each attempt counts from its start to its end, at most its \
                  timeout. An attempt's start holds its whole timeout and its end gives back what it did not use, \
                  so a call whose timeout does not fit waits while running calls hold time, and settles as \
                  `budget_exceeded` once none do; a call with no timeout (`timeout_ms: 0`) cannot run under it. \
                  A raise answers `{\"max_time_ms\": 600000}`.",
        example: "10m",
    },
    Key {
        name: "approval",
        section: Section::Budget,
        value: "mapping (keys below, under `rules[].approval, budgets[].approval`)",
        default: "none: a call past the limit settles as `budget_exceeded`",
        meaning: "A call past the limit waits for a person instead (`run:interrupted`, reason \
                  `budget_exceeded`), who answers with the limit's new bounds (`{\"max_cost\": 10.0}`): the call \
                  then starts under the raised limit; rejected or expired, it settles as `budget_exceeded`.",
        example: "{ approvers: [finance], timeout: 1h }",
    },
    Key {
        name: "tools",
        section: Section::Limit,
        value: "glob (required)",
        default: "none: a limit names its tools",
        meaning: "The limit counts calls of tools whose name matches, together. Its state (tokens, calls running) \
                  is kept in the database under this glob, so it holds through restarts and reloads; two limits \
                  may not name the same glob.",
        example: "\"payments_*\"",
    },
    Key {
        name: "per_second",
        section: Section::Limit,
        value: "number above 0",
        default: "no limit on rate",
        meaning: "At most this many calls start each second on average (a token bucket refilled at this rate; \
                  each attempt takes a token). A retry's attempt counts; a replayed or cached call does not.",
        example: "10",
    },
    Key {
        name: "burst",
        section: Section::Limit,
        value: "integer, 1 or more",
        default: "one second's worth of `per_second`, at least 1",
        meaning: "At most this many calls start at once after a quiet spell (the bucket's size). Needs \
                  `per_second`.",
        example: "20",
    },
    Key {
        name: "at_once",
        section: Section::Limit,
        value: "integer, 1 or more",
        default: "no limit on calls at once",
        meaning: "At most this many calls run at once. A limit sets `per_second`, `at_once` or both.",
        example: "4",
    },
    Key {
        name: "label",
        section: Section::FairShares,
        value: "label name (required)",
        default: "none: the shares name their label",
        meaning: "The run label whose value names a run's share (subagents and branches carry their parent's \
                  labels). Runs without the label share one share of weight 1.",
        example: "tenant",
    },
    Key {
        name: "weights",
        section: Section::FairShares,
        value: "mapping of label value to integer, 1 to 1000",
        default: "1 for every value",
        meaning: "How much each share is served while several wait: a share of weight 4 starts four calls for \
                  each one a share of weight 1 starts. A share has no quota: alone, it takes all there is.",
        example: "{ acme: 4, free: 1 }",
    },
];

/// A short complete policy file, shown on the reference page; the tests load it.
#[cfg(test)]
pub(crate) const EXAMPLE: &str = r#"default: deny                          # nothing runs unless allowed below
deny_list: ["rm_*"]
max_risk: { ceiling: high, approve_above: medium }
require_permissions: true
rules:
  - id: reads
    match: { read_only: true }
    decision: allow
  - id: big-refunds
    priority: 10
    match:
      tools: ["refund*"]
      agents: ["billing-*"]
      when: "args.cents > 10000"
    decision: approve
    reason: "refunds over $100 need a person"
    approval: { timeout: 1h, approvers: ["payments-oncall"] }
  - id: refunds
    match: { tools: ["refund*"] }
    decision: allow
  - id: prod-frozen
    priority: 20
    match: { resources: ["repo:prod-*"], writes: true }
    decision: deny
    reason: "production repositories are frozen"
budgets:
  - labels: { team: billing }
    max_cost: 5.00
    approval: { approvers: [finance], timeout: 1h }
  - tools: "payments_*"
    max_calls: 100
    max_time: 10m
limits:
  - tools: "payments_*"
    per_second: 10
    at_once: 4
fair_shares:
  label: tenant
  weights: { acme: 4 }
"#;
