//! API keys with scopes.
//!
//! The kernel reads its keys from an auth file (`--auth-file`), YAML, one entry per key:
//!
//! ```yaml
//! keys:
//!   - name: ci-reader                  # recorded as the approver, named in refusals and logs
//!     sha256: 9f86d0...                # hex SHA-256 of the secret; the secret itself is never stored
//!     scopes: ["runs:read"]
//!   - name: billing-worker
//!     sha256: 60303a...
//!     scopes: ["workers:connect"]
//!     tools: ["refund*", "billing_*"]  # tool-name globs this worker may register
//!   - name: billing-agent
//!     sha256: 2c26b4...
//!     scopes: ["runs:write", "tools:call"]
//!     grants: ["billing:*"]            # permission globs the runs it creates may hold
//!   - name: alice
//!     sha256: fcde2b...
//!     scopes: ["approvals:write", "runs:read"]
//!     groups: ["payments-oncall"]      # names a rule's `approvers` may list instead of hers
//! ```
//!
//! With keys, a run's permissions must be among its creating key's `grants` ([`Caller::may_grant`]),
//! and an approval whose rule lists `approvers` may be answered only by a key named there, or in
//! one of the groups named there ([`Caller::may_answer`]).
//!
//! A client sends its secret as `authorization: Bearer <secret>` metadata. [`KeyRing::authorize`]
//! hashes it, compares the digest with every stored one in constant time, and checks that the key
//! holds the scope of the method called ([`required_scope`]); [`Guarded`] does this in front of
//! each `kernel.v1` service, so a refused request never reaches a handler and writes nothing.
//! Health and reflection are not guarded. The handlers find the authenticated [`Caller`] in the
//! request's extensions: approvals record its name as the decider, and a worker session refuses
//! a hello that offers a tool outside the key's globs ([`Caller::may_register`]).
//!
//! Beside keys, the file may name an OAuth authorization server whose access tokens are accepted
//! too (`oauth:`, see [`oauth`]): a bearer that is no key and has a JWT's shape is checked there.
//!
//! SIGHUP reads the file again ([`Keys::reload`]); a file that does not load is refused with its
//! reason and the keys in force stay. A new file applies to the next request at once, and an open
//! worker session whose key was removed, or no longer allows a tool it offers, is closed.

mod guard;
mod oauth;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::error::KernelError;
use crate::policy::glob::{self, GlobList};

pub use guard::Guarded;
pub use oauth::Oauth;

/// What a key may do. `admin` implies every other scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Read runs, events, approvals, tools and workers.
    RunsRead,
    /// Create, complete, fail and cancel runs.
    RunsWrite,
    /// Submit turns of tool calls.
    ToolsCall,
    /// Approve or reject parked calls.
    ApprovalsWrite,
    /// Open a worker session (and register the tools the key's globs allow).
    WorkersConnect,
    /// Everything, including `AdminService`.
    Admin,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 6] = [
        Scope::RunsRead,
        Scope::RunsWrite,
        Scope::ToolsCall,
        Scope::ApprovalsWrite,
        Scope::WorkersConnect,
        Scope::Admin,
    ];

    /// The name used in auth files and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::RunsRead => "runs:read",
            Scope::RunsWrite => "runs:write",
            Scope::ToolsCall => "tools:call",
            Scope::ApprovalsWrite => "approvals:write",
            Scope::WorkersConnect => "workers:connect",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Scope::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| {
            let known: Vec<_> = Scope::ALL.iter().map(|s| s.as_str()).collect();
            format!("unknown scope '{text}'; known: {}", known.join(", "))
        })
    }
}

/// The scope a `kernel.v1` method needs, by its gRPC path (`/kernel.v1.RunService/GetRun`).
/// A method this table does not know needs `admin`, so a new RPC is closed until it is mapped.
pub fn required_scope(path: &str) -> Scope {
    let method = path.strip_prefix("/kernel.v1.").unwrap_or("");
    match method {
        "RunService/GetRun"
        | "RunService/ListRuns"
        | "RunService/ListRunEvents"
        | "RunService/WatchRunEvents"
        | "RunService/ListReceipts" => Scope::RunsRead,
        "RunService/CreateRun"
        | "RunService/ForkRun"
        | "RunService/CompleteRun"
        | "RunService/FailRun"
        | "RunService/CancelRun"
        | "ToolCallService/CancelCall"
        | "ToolCallService/AskPerson" => Scope::RunsWrite,
        "ToolCallService/SubmitTurn" | "ToolCallService/CallTurn" => Scope::ToolsCall,
        "ApprovalService/ListApprovals" => Scope::RunsRead,
        "ApprovalService/ApproveCall" | "ApprovalService/RejectCall" => Scope::ApprovalsWrite,
        // A hosted handler's operations come from its worker, fenced by the run's dispatch.
        "WorkerService/OpenSession" => Scope::WorkersConnect,
        _ if method.starts_with("HostedService/") => Scope::WorkersConnect,
        _ if method.starts_with("RegistryService/") => Scope::RunsRead,
        _ => Scope::Admin,
    }
}

/// The hex SHA-256 of a secret: what an auth file stores.
pub fn secret_digest_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Equality of two digests in time independent of where they differ.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The authenticated key behind a request; handlers find it in the request's extensions.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Caller(Arc<KeyInfo>);

#[derive(Debug)]
struct KeyInfo {
    digest: [u8; 32],
    name: String,
    scopes: HashSet<Scope>,
    tools: Option<GlobList>,
    /// Permission globs the runs this key creates may hold.
    grants: Option<GlobList>,
    /// Groups the key's holder belongs to, for approvers lists.
    groups: Vec<String>,
}

impl Caller {
    /// The key's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Whether the key holds `scope` (`admin` holds them all).
    pub fn has(&self, scope: Scope) -> bool {
        self.0.scopes.contains(&Scope::Admin) || self.0.scopes.contains(&scope)
    }

    /// Whether a run this key creates may hold `permissions`: each must match one of the key's
    /// `grants` (an `admin` key may grant any). The refusal names the first one that does not.
    pub fn may_grant(&self, permissions: &[String]) -> Result<(), KernelError> {
        if self.0.scopes.contains(&Scope::Admin) {
            return Ok(());
        }
        for (index, permission) in permissions.iter().enumerate() {
            let granted = self.0.grants.as_ref().is_some_and(|g| g.is_match(permission));
            if !granted {
                let grants = self
                    .0
                    .grants
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), GlobList::describe);
                return Err(KernelError::PermissionDenied(format!(
                    "permissions[{index}]: key '{}' may not grant '{permission}' (its grants: {grants})",
                    self.0.name
                )));
            }
        }
        Ok(())
    }

    /// Whether this key may answer an approval whose rule lists `approvers`: anyone with the
    /// scope when the list is empty, else only a key named there or in a group named there.
    pub fn may_answer(&self, approvers: &[String]) -> Result<(), KernelError> {
        let listed = approvers
            .iter()
            .any(|a| *a == self.0.name || self.0.groups.iter().any(|g| g == a));
        if approvers.is_empty() || listed {
            return Ok(());
        }
        let groups = if self.0.groups.is_empty() {
            "no groups".to_owned()
        } else {
            format!("groups {}", self.0.groups.join(", "))
        };
        Err(KernelError::PermissionDenied(format!(
            "key '{}' ({groups}) is not among this approval's approvers ({})",
            self.0.name,
            approvers.join(", ")
        )))
    }

    /// Whether a worker holding this key may register `tool`: an `admin` key may register any
    /// tool, a worker key those its globs match.
    pub fn may_register(&self, tool: &str) -> Result<(), KernelError> {
        if self.0.scopes.contains(&Scope::Admin) {
            return Ok(());
        }
        match &self.0.tools {
            Some(globs) if globs.is_match(tool) => Ok(()),
            Some(globs) => Err(KernelError::PermissionDenied(format!(
                "key '{}' may not register tool '{tool}' (its tools: {})",
                self.0.name,
                globs.describe()
            ))),
            None => Err(KernelError::PermissionDenied(format!(
                "key '{}' may not register tool '{tool}' (it lists no tools)",
                self.0.name
            ))),
        }
    }
}

/// One stored key.
#[derive(Debug)]
struct Key {
    digest: [u8; 32],
    caller: Caller,
}

/// The keys in force and the file they come from. Cheap to read: each request takes the current
/// ring; a reload swaps it whole, and open worker sessions watch the swap.
#[derive(Debug)]
pub struct Keys {
    path: PathBuf,
    ring: watch::Sender<Arc<KeyRing>>,
}

impl Keys {
    /// Reads the auth file; a file that does not load stops the kernel with the reason.
    pub fn load(path: &Path) -> Result<Keys, KernelError> {
        let ring = KeyRing::load(path)?;
        Ok(Keys {
            path: path.to_owned(),
            ring: watch::Sender::new(Arc::new(ring)),
        })
    }

    /// The keys requests are checked against now.
    pub fn current(&self) -> Arc<KeyRing> {
        self.ring.borrow().clone()
    }

    /// Changes of the keys in force, for sessions that outlive a reload.
    pub fn watch(&self) -> watch::Receiver<Arc<KeyRing>> {
        self.ring.subscribe()
    }

    /// Reads the file again and puts its keys in force; a file that does not load is refused and
    /// the keys in force stay. Returns how many keys the file holds.
    pub fn reload(&self) -> Result<usize, KernelError> {
        match KeyRing::load(&self.path) {
            Ok(ring) => {
                let count = ring.len();
                self.ring.send_replace(Arc::new(ring));
                info!(keys = count, file = %self.path.display(), "api keys reloaded");
                Ok(count)
            }
            Err(err) => {
                error!(error = %err, "api keys not reloaded; the keys in force stay");
                Err(err)
            }
        }
    }
}

/// The keys the kernel accepts, loaded from the auth file, and the authorization server whose
/// access tokens it accepts beside them.
#[derive(Debug)]
pub struct KeyRing {
    keys: Vec<Key>,
    oauth: Option<Oauth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    keys: Vec<FileKey>,
    #[serde(default)]
    oauth: Option<oauth::FileOauth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    name: String,
    sha256: String,
    scopes: Vec<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    grants: Option<Vec<String>>,
    #[serde(default)]
    groups: Vec<String>,
}

/// Compiles a list of globs from the auth file.
fn globs(patterns: &[String]) -> Result<GlobList, String> {
    let compiled = patterns
        .iter()
        .map(|p| glob::compile(p))
        .collect::<Result<Vec<_>, _>>()?;
    GlobList::new(compiled)
}

/// Longest key name accepted; the name is recorded as the approver.
const MAX_NAME_LEN: usize = 128;

impl KeyRing {
    /// Reads an auth file; a file that does not load stops the kernel with the reason.
    pub fn load(path: &Path) -> Result<KeyRing, KernelError> {
        let invalid = |message: String| KernelError::invalid("--auth-file", format!("{}: {message}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read: {e}")))?;
        KeyRing::from_yaml_at(&text, &oauth::base_of(path)).map_err(invalid)
    }

    /// Parses the auth file's text (see the module docs for the format), its relative paths taken
    /// from the working directory.
    pub fn from_yaml(text: &str) -> Result<KeyRing, String> {
        KeyRing::from_yaml_at(text, Path::new(""))
    }

    /// Parses the auth file's text, its relative paths (`oauth.jwks_file`) taken from `base`.
    pub fn from_yaml_at(text: &str, base: &Path) -> Result<KeyRing, String> {
        let doc: FileDoc = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        let oauth = doc.oauth.map(|section| Oauth::load(section, base)).transpose()?;
        let mut names = HashSet::new();
        let mut digests = HashSet::new();
        let mut keys = Vec::with_capacity(doc.keys.len());
        for (index, entry) in doc.keys.into_iter().enumerate() {
            let at = |message: String| format!("keys[{index}]: {message}");
            let name = entry.name.trim().to_owned();
            if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
                return Err(at(format!(
                    "name must be 1 to {MAX_NAME_LEN} characters without control characters"
                )));
            }
            if !names.insert(name.clone()) {
                return Err(at(format!("name '{name}' is used twice")));
            }
            let digest = parse_digest(&entry.sha256).map_err(|m| at(format!("{name}: sha256 {m}")))?;
            if !digests.insert(digest) {
                return Err(at(format!("{name}: the same secret is listed twice")));
            }
            if entry.scopes.is_empty() {
                return Err(at(format!("{name}: scopes must list at least one scope")));
            }
            let scopes = entry
                .scopes
                .iter()
                .map(|s| s.parse::<Scope>())
                .collect::<Result<HashSet<_>, _>>()
                .map_err(|m| at(format!("{name}: {m}")))?;
            let tools = match entry.tools {
                None if scopes.contains(&Scope::WorkersConnect) && !scopes.contains(&Scope::Admin) => {
                    return Err(at(format!(
                        "{name}: a key with workers:connect must list the tools it may register (\"*\" for any)"
                    )));
                }
                None => None,
                Some(_) if !scopes.contains(&Scope::WorkersConnect) && !scopes.contains(&Scope::Admin) => {
                    return Err(at(format!("{name}: tools apply only to keys with workers:connect")));
                }
                Some(patterns) => Some(globs(&patterns).map_err(|m| at(format!("{name}: tools: {m}")))?),
            };
            let grants = match entry.grants {
                None => None,
                Some(_) if !scopes.contains(&Scope::RunsWrite) && !scopes.contains(&Scope::Admin) => {
                    return Err(at(format!("{name}: grants apply only to keys with runs:write")));
                }
                Some(patterns) => Some(globs(&patterns).map_err(|m| at(format!("{name}: grants: {m}")))?),
            };
            let mut groups = Vec::with_capacity(entry.groups.len());
            for group in entry.groups {
                let group = group.trim().to_owned();
                if group.is_empty() || group.len() > MAX_NAME_LEN || group.chars().any(char::is_control) {
                    return Err(at(format!(
                        "{name}: a group must be 1 to {MAX_NAME_LEN} characters without control characters"
                    )));
                }
                groups.push(group);
            }
            keys.push(Key {
                digest,
                caller: Caller(Arc::new(KeyInfo {
                    digest,
                    name,
                    scopes,
                    tools,
                    grants,
                    groups,
                })),
            });
        }
        Ok(KeyRing { keys, oauth })
    }

    /// The authorization server whose tokens are accepted, if the file names one.
    pub fn oauth(&self) -> Option<&Oauth> {
        self.oauth.as_ref()
    }

    /// How many keys the file holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the file holds no key and names no authorization server (then every guarded
    /// request is refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.oauth.is_none()
    }

    /// The key whose secret is `secret`. Every stored digest is compared, each in constant time.
    pub fn authenticate(&self, secret: &str) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            if digests_equal(&key.digest, &digest) {
                found = Some(key.caller.clone());
            }
        }
        found
    }

    /// Whether a worker session opened with `caller`'s key may stay open under these keys, offering
    /// `tools`: the key must still be here, hold `workers:connect` and allow each tool.
    pub fn still_admits(&self, caller: &Caller, tools: &[String]) -> Result<(), KernelError> {
        let mut found = None;
        for key in &self.keys {
            if digests_equal(&key.digest, &caller.0.digest) {
                found = Some(&key.caller);
            }
        }
        let Some(current) = found else {
            return Err(KernelError::Unauthenticated(format!(
                "key '{}' was removed from the auth file",
                caller.name()
            )));
        };
        if !current.has(Scope::WorkersConnect) {
            return Err(KernelError::PermissionDenied(format!(
                "key '{}' no longer holds scope '{}'",
                current.name(),
                Scope::WorkersConnect
            )));
        }
        tools.iter().try_for_each(|tool| current.may_register(tool))
    }

    /// Checks an `authorization` header value against the scope `path` needs.
    /// No or an unknown key is `Unauthenticated`; a key without the scope `PermissionDenied`.
    pub fn authorize(&self, path: &str, authorization: Option<&[u8]>) -> Result<Caller, KernelError> {
        let Some(header) = authorization else {
            return Err(KernelError::Unauthenticated(
                "missing API key: this kernel requires one (kernelctl and the demo binaries: --api-key or \
                 KERNEL_API_KEY; the SDK: .api_key(...)); it travels as 'authorization: Bearer <key>'"
                    .into(),
            ));
        };
        let secret = std::str::from_utf8(header)
            .ok()
            .and_then(|value| {
                let (scheme, secret) = value.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| secret.trim())
            })
            .filter(|secret| !secret.is_empty())
            .ok_or_else(|| KernelError::Unauthenticated("the authorization metadata is not 'Bearer <key>'".into()))?;
        let caller = match (self.authenticate(secret), &self.oauth) {
            (Some(caller), _) => caller,
            (None, Some(oauth)) if oauth::looks_like_a_token(secret) => {
                oauth.caller(secret, |name| self.keys.iter().any(|key| key.caller.name() == name))?
            }
            (None, _) => return Err(KernelError::Unauthenticated("unknown API key".into())),
        };
        let scope = required_scope(path);
        if !caller.has(scope) {
            return Err(KernelError::PermissionDenied(format!(
                "key '{}' lacks scope '{scope}' needed for {}",
                caller.name(),
                path.trim_start_matches('/')
            )));
        }
        Ok(caller)
    }
}

/// The keys to enforce, from `--auth-file`, or `None` when authentication is off. Without an auth
/// file the kernel may listen only on a loopback address unless `insecure` says otherwise.
pub fn load(auth_file: Option<&Path>, listen: SocketAddr, insecure: bool) -> Result<Option<Arc<Keys>>, KernelError> {
    match auth_file {
        Some(path) => {
            let keys = Keys::load(path)?;
            let ring = keys.current();
            info!(keys = ring.len(), file = %path.display(), "api keys required");
            if let Some(oauth) = ring.oauth() {
                info!(
                    issuer = oauth.issuer(),
                    audience = oauth.audience(),
                    keys = oauth.key_count(),
                    "oauth access tokens accepted"
                );
            }
            Ok(Some(Arc::new(keys)))
        }
        None if listen.ip().is_loopback() => {
            info!("no --auth-file: serving without authentication, on loopback only");
            Ok(None)
        }
        None if insecure => {
            warn!(%listen, "no --auth-file and --insecure: anyone who can reach this address may do anything");
            Ok(None)
        }
        None => Err(KernelError::invalid(
            "--listen",
            format!(
                "{listen} is not a loopback address; give --auth-file to require API keys, \
                 or --insecure to serve it without authentication"
            ),
        )),
    }
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bytes = hex::decode(text).map_err(|_| "must be 64 hex digits".to_owned())?;
    bytes
        .try_into()
        .map_err(|_| "must be 64 hex digits (a SHA-256 of the secret)".to_owned())
}

#[cfg(test)]
mod tests;
