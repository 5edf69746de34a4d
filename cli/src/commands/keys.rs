//! `kernelctl keys create`: a new API key for the kernel's auth file.
//!
//! The secret is 32 random bytes from the operating system, hex-encoded behind a `kk_` prefix.
//! It is printed once, on stdout; the kernel's auth file stores only its SHA-256, in the entry
//! printed on stderr (or, with `--json`, both in one document on stdout).

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::args::KeyCreateArgs;

/// Longest key name the kernel accepts.
const MAX_NAME_LEN: usize = 128;

/// A new key: its secret and the auth-file entry that accepts it.
#[derive(Debug, Serialize)]
struct NewKey {
    name: String,
    secret: String,
    sha256: String,
    scopes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    grants: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
    /// The YAML entry to add under `keys:` in the auth file.
    entry: String,
}

/// Checks the arguments the way the kernel will read the entry.
fn check(args: &KeyCreateArgs) -> Result<(), String> {
    let name = args.name.trim();
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(format!(
            "--name must be 1 to {MAX_NAME_LEN} characters without control characters"
        ));
    }
    let has = |scope: &str| args.scopes.iter().any(|s| s == scope);
    let worker = has("workers:connect") || has("admin");
    if has("workers:connect") && !has("admin") && args.tools.is_empty() {
        return Err("a key with workers:connect needs --tools GLOB (\"*\" for any tool)".into());
    }
    if !args.tools.is_empty() && !worker {
        return Err("--tools applies only to keys with --scope workers:connect".into());
    }
    if args.tools.iter().any(|t| t.is_empty()) {
        return Err("--tools must not be empty".into());
    }
    if !args.grants.is_empty() && !has("runs:write") && !has("admin") {
        return Err("--grants applies only to keys with --scope runs:write".into());
    }
    if args.grants.iter().any(|g| g.is_empty()) {
        return Err("--grants must not be empty".into());
    }
    if args
        .groups
        .iter()
        .any(|g| g.trim().is_empty() || g.len() > MAX_NAME_LEN || g.chars().any(char::is_control))
    {
        return Err(format!(
            "--group must be 1 to {MAX_NAME_LEN} characters without control characters"
        ));
    }
    Ok(())
}

/// Compact JSON of a string or list: JSON strings are YAML double-quoted scalars.
fn json<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("strings serialize")
}

/// The auth-file entry, in YAML.
fn entry(name: &str, digest: &str, scopes: &[String], lists: [(&str, &[String]); 3]) -> String {
    let mut text = format!(
        "  - name: {}\n    sha256: {digest}\n    scopes: {}\n",
        json(name),
        json(scopes)
    );
    for (field, values) in lists {
        if !values.is_empty() {
            text.push_str(&format!("    {field}: {}\n", json(values)));
        }
    }
    text
}

fn new_key(args: KeyCreateArgs) -> Result<NewKey, String> {
    check(&args)?;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the operating system: {e}"))?;
    let secret = format!("kk_{}", hex::encode(bytes));
    let sha256 = hex::encode(Sha256::digest(secret.as_bytes()));
    let mut scopes = args.scopes;
    scopes.dedup();
    let name = args.name.trim().to_owned();
    let groups: Vec<String> = args.groups.iter().map(|g| g.trim().to_owned()).collect();
    let entry = entry(
        &name,
        &sha256,
        &scopes,
        [("tools", &args.tools), ("grants", &args.grants), ("groups", &groups)],
    );
    Ok(NewKey {
        name,
        secret,
        sha256,
        scopes,
        tools: args.tools,
        grants: args.grants,
        groups,
        entry,
    })
}

/// Runs `keys create`: exit 0 with the key printed, 2 on arguments the kernel would refuse.
pub fn create(args: KeyCreateArgs, json: bool) -> ExitCode {
    let key = match new_key(args) {
        Ok(key) => key,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let written = if json {
        serde_json::to_writer_pretty(&mut stdout, &key)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(stdout))
    } else {
        writeln!(stdout, "{}", key.secret)
    };
    if let Err(error) = written {
        eprintln!("error: cannot write output: {error}");
        return ExitCode::FAILURE;
    }
    if !json {
        eprintln!(
            "# Above: the secret of key '{}'. It is shown only this once; the kernel keeps only its hash.\n\
             # Add this entry under `keys:` in the kernel's auth file (kernel --auth-file FILE):\n{}",
            key.name, key.entry
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(scopes: &[&str], tools: &[&str]) -> KeyCreateArgs {
        KeyCreateArgs {
            name: "ci".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            tools: tools.iter().map(|s| s.to_string()).collect(),
            grants: Vec::new(),
            groups: Vec::new(),
        }
    }

    #[test]
    fn grants_and_groups_go_into_the_entry() {
        let mut agent = args(&["runs:write", "tools:call"], &[]);
        agent.grants = vec!["billing:*".into()];
        agent.groups = vec![" payments-oncall ".into()];
        let key = new_key(agent).unwrap();
        assert!(
            key.entry
                .ends_with("    grants: [\"billing:*\"]\n    groups: [\"payments-oncall\"]\n"),
            "{}",
            key.entry
        );
        let mut reader = args(&["runs:read"], &[]);
        reader.grants = vec!["billing:*".into()];
        assert!(new_key(reader).unwrap_err().contains("runs:write"));
    }

    #[test]
    fn a_key_and_its_entry_agree() {
        let key = new_key(args(&["workers:connect"], &["refund*"])).unwrap();
        assert!(key.secret.starts_with("kk_") && key.secret.len() == 3 + 64);
        assert_eq!(key.sha256, hex::encode(Sha256::digest(key.secret.as_bytes())));
        assert!(!key.entry.contains(&key.secret));
        assert_eq!(
            key.entry,
            format!(
                "  - name: \"ci\"\n    sha256: {}\n    scopes: [\"workers:connect\"]\n    tools: [\"refund*\"]\n",
                key.sha256
            )
        );
        let other = new_key(args(&["runs:read"], &[])).unwrap();
        assert_ne!(key.secret, other.secret);
        assert!(!other.entry.contains("tools"));
    }

    #[test]
    fn arguments_the_kernel_would_refuse_are_refused_here() {
        assert!(
            new_key(args(&["workers:connect"], &[]))
                .unwrap_err()
                .contains("--tools")
        );
        assert!(
            new_key(args(&["runs:read"], &["*"]))
                .unwrap_err()
                .contains("workers:connect")
        );
        assert!(new_key(args(&["admin"], &[])).is_ok());
        let mut unnamed = args(&["admin"], &[]);
        unnamed.name = " ".into();
        assert!(new_key(unnamed).unwrap_err().contains("--name"));
    }
}
