//! The config file: which MCP servers to wrap, how to reach each, and what to declare of their
//! tools. Checked whole at start, each mistake named by its place in the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use worker_sdk::RiskLevel;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    /// MCP servers by name; the name is also the default prefix of their tools.
    servers: BTreeMap<String, RawServer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    prefix: Option<String>,
    strip_nulls: Option<bool>,
    #[serde(default)]
    requires_approval: Vec<RawApproval>,
    risk: Option<String>,
    #[serde(default)]
    permissions: Vec<String>,
    owner: Option<String>,
    version: Option<String>,
    unit_price: Option<f64>,
    /// Seconds.
    timeout: Option<f64>,
    retries: Option<u32>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// A `requires_approval` entry: a tool-name glob (always ask), or a glob with a CEL predicate.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawApproval {
    Always(String),
    When { tool: String, when: String },
}

/// Where a server is.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A command speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// When a tool asks a person first.
#[derive(Debug, Clone)]
pub struct ApprovalRule {
    pub tools: GlobSet,
    /// `None`: always.
    pub when: Option<String>,
}

/// One server, checked.
#[derive(Debug, Clone)]
pub struct Server {
    pub name: String,
    pub transport: Transport,
    pub prefix: String,
    pub strip_nulls: bool,
    pub approvals: Vec<ApprovalRule>,
    pub risk: Option<RiskLevel>,
    pub permissions: Vec<String>,
    pub owner: Option<String>,
    pub version: Option<String>,
    pub unit_price: Option<f64>,
    pub timeout: Option<Duration>,
    pub retries: Option<u32>,
    /// Bare MCP names to offer; `None` offers all.
    pub allow: Option<GlobSet>,
    pub deny: Option<GlobSet>,
}

impl Server {
    /// Whether the server's tool `name` (its bare MCP name) is offered.
    pub fn offers(&self, name: &str) -> bool {
        self.allow.as_ref().is_none_or(|allow| allow.is_match(name))
            && !self.deny.as_ref().is_some_and(|deny| deny.is_match(name))
    }
}

/// Reads and checks the config file.
pub fn load(path: &Path) -> Result<Vec<Server>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text, &|name| std::env::var(name).ok()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks a config's text; `env` reads the variables `${NAME}` in env and header values refer to.
pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Server>, String> {
    let raw: RawConfig = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    if raw.servers.is_empty() {
        return Err("servers: name at least one MCP server".into());
    }
    raw.servers
        .into_iter()
        .map(|(name, server)| check(&name, server, env).map_err(|e| format!("servers.{name}.{e}")))
        .collect()
}

fn check(name: &str, raw: RawServer, env: &dyn Fn(&str) -> Option<String>) -> Result<Server, String> {
    let expand_all = |field: &str, values: BTreeMap<String, String>| -> Result<BTreeMap<String, String>, String> {
        values
            .into_iter()
            .map(|(key, value)| {
                Ok((
                    key.clone(),
                    expand(&value, env).map_err(|e| format!("{field}.{key}: {e}"))?,
                ))
            })
            .collect()
    };
    let transport = match (raw.command, raw.url) {
        (Some(command), None) => Transport::Stdio {
            command,
            args: raw.args,
            env: expand_all("env", raw.env)?,
            cwd: raw.cwd,
        },
        (None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("url: '{url}' is not an http:// or https:// URL"));
            }
            if !raw.args.is_empty() || !raw.env.is_empty() || raw.cwd.is_some() {
                return Err("args: args, env and cwd belong to a command, not a url".into());
            }
            Transport::Http {
                url,
                headers: expand_all("headers", raw.headers)?,
            }
        }
        (Some(_), Some(_)) => return Err("command: give a command or a url, not both".into()),
        (None, None) => return Err("command: give a command (stdio) or a url (Streamable HTTP)".into()),
    };
    let prefix = raw.prefix.unwrap_or_else(|| name.to_owned());
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!("prefix: '{prefix}' may hold only [a-zA-Z0-9_-]"));
    }
    let approvals = raw
        .requires_approval
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let (tool, when) = match entry {
                RawApproval::Always(tool) => (tool, None),
                RawApproval::When { tool, when } => (tool, Some(when)),
            };
            if when.as_ref().is_some_and(|w| w.trim().is_empty()) {
                return Err(format!("requires_approval[{index}].when: empty; drop it to always ask"));
            }
            let tools = globs(std::slice::from_ref(&tool)).map_err(|e| format!("requires_approval[{index}]: {e}"))?;
            Ok(ApprovalRule { tools, when })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let risk = raw
        .risk
        .map(|risk| match risk.as_str() {
            "low" => Ok(RiskLevel::Low),
            "medium" => Ok(RiskLevel::Medium),
            "high" => Ok(RiskLevel::High),
            "critical" => Ok(RiskLevel::Critical),
            other => Err(format!("risk: '{other}' is not low, medium, high or critical")),
        })
        .transpose()?;
    if let Some(price) = raw.unit_price
        && !(price.is_finite() && price >= 0.0)
    {
        return Err(format!("unit_price: {price} is not a finite number >= 0"));
    }
    let timeout = raw
        .timeout
        .map(|seconds| {
            if seconds.is_finite() && seconds > 0.0 {
                Ok(Duration::from_secs_f64(seconds))
            } else {
                Err(format!("timeout: {seconds} is not a positive number of seconds"))
            }
        })
        .transpose()?;
    let allow = (!raw.allow.is_empty())
        .then(|| globs(&raw.allow).map_err(|e| format!("allow: {e}")))
        .transpose()?;
    let deny = (!raw.deny.is_empty())
        .then(|| globs(&raw.deny).map_err(|e| format!("deny: {e}")))
        .transpose()?;
    Ok(Server {
        name: name.to_owned(),
        transport,
        prefix,
        strip_nulls: raw.strip_nulls.unwrap_or(true),
        approvals,
        risk,
        permissions: raw.permissions,
        owner: raw.owner,
        version: raw.version,
        unit_price: raw.unit_price,
        timeout,
        retries: raw.retries,
        allow,
        deny,
    })
}

fn globs(patterns: &[String]) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for pattern in patterns {
        set.add(Glob::new(pattern).map_err(|e| format!("'{pattern}' is not a glob: {}", e.kind()))?);
    }
    set.build().map_err(|e| e.to_string())
}

/// Replaces each `${NAME}` with the variable's value; a variable that is not set is an error, so a
/// missing secret is found at start rather than sent as text.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            return Err(format!("'{value}' has '${{' without a closing '}}'"));
        };
        let name = &rest[start + 2..start + end];
        let found = env(name).ok_or_else(|| format!("the environment variable {name} is not set"))?;
        out.push_str(&found);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    fn refused(text: &str) -> String {
        parse(text, &env).expect_err("refused")
    }

    #[test]
    fn three_lines_wrap_a_server_with_every_default() {
        let servers = parse("servers:\n  time:\n    command: mcp-server-time\n", &env).unwrap();
        let time = &servers[0];
        assert_eq!((time.name.as_str(), time.prefix.as_str()), ("time", "time"));
        assert!(time.strip_nulls && time.approvals.is_empty() && time.offers("get_current_time"));
        assert!(matches!(&time.transport, Transport::Stdio { command, .. } if command == "mcp-server-time"));
    }

    #[test]
    fn every_override_is_read() {
        let text = r#"
servers:
  remote:
    url: https://mcp.example.com/mcp
    headers: { Authorization: "Bearer ${TOKEN}" }
    prefix: ""
    strip_nulls: false
    requires_approval: ["delete_*", { tool: "send", when: "args.to.endsWith('@example.com') == false" }]
    risk: high
    permissions: [mail:send]
    owner: comms
    version: "3"
    unit_price: 0.002
    timeout: 2.5
    retries: 2
    allow: ["*"]
    deny: ["admin_*"]
"#;
        let remote = &parse(text, &env).unwrap()[0];
        assert_eq!(
            remote.transport,
            Transport::Http {
                url: "https://mcp.example.com/mcp".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
            }
        );
        assert_eq!(remote.prefix, "");
        assert!(!remote.strip_nulls);
        assert_eq!(remote.approvals.len(), 2);
        assert!(remote.approvals[0].tools.is_match("delete_user") && remote.approvals[0].when.is_none());
        assert!(remote.approvals[1].when.is_some());
        assert_eq!(remote.risk, Some(RiskLevel::High));
        assert_eq!(remote.timeout, Some(Duration::from_millis(2500)));
        assert!(remote.offers("send") && !remote.offers("admin_reset"));
    }

    /// The configs the MCP guide shows must load as shown (their `${NAME}`s set).
    #[test]
    fn the_configs_in_the_docs_load() {
        let guide = include_str!("../../docs/guides/mcp.md");
        let blocks: Vec<&str> = guide
            .split("```yaml\n")
            .skip(1)
            .map(|rest| &rest[..rest.find("```").expect("the block ends")])
            .filter(|block| block.starts_with("servers:"))
            .collect();
        assert_eq!(blocks.len(), 2, "{blocks:?}");
        for block in blocks {
            parse(block, &|_| Some("set".to_owned())).unwrap_or_else(|e| panic!("{e}\n{block}"));
        }
    }

    #[test]
    fn mistakes_are_named_by_their_place() {
        let cases = [
            ("servers: {}\n", "servers: name at least one"),
            (
                "servers:\n  a: { args: [x] }\n",
                "servers.a.command: give a command (stdio) or a url",
            ),
            (
                "servers:\n  a: { command: x, url: 'http://h' }\n",
                "servers.a.command: give a command or a url, not both",
            ),
            (
                "servers:\n  a: { url: 'ftp://h' }\n",
                "servers.a.url: 'ftp://h' is not an http",
            ),
            ("servers:\n  a: { command: x, risk: huge }\n", "servers.a.risk: 'huge'"),
            (
                "servers:\n  a: { command: x, prefix: 'a.b' }\n",
                "servers.a.prefix: 'a.b'",
            ),
            ("servers:\n  a: { command: x, timeout: 0 }\n", "servers.a.timeout: 0"),
            (
                "servers:\n  a: { command: x, env: { K: '${NOPE}' } }\n",
                "servers.a.env.K: the environment variable NOPE",
            ),
            (
                "servers:\n  a: { command: x, allow: ['[z-a]'] }\n",
                "servers.a.allow: '[z-a]' is not a glob",
            ),
            ("servers:\n  a: { command: x, colour: red }\n", "unknown field `colour`"),
        ];
        for (text, expected) in cases {
            let message = refused(text);
            assert!(message.contains(expected), "{text}: {message}");
        }
    }
}
