//! Access tokens from an OAuth 2.1 authorization server, accepted beside API keys: the auth file's
//! `oauth` section names the server (`issuer`), this kernel as the resource its tokens must be
//! for (`audience`), and the server's public keys (`jwks_file`, a JWK Set as the server publishes
//! it at its `jwks_uri`).
//!
//! ```yaml
//! oauth:
//!   issuer: https://idp.example.com/realms/agents
//!   audience: https://kernel.example.com/mcp
//!   jwks_file: idp-jwks.json          # relative to the auth file; SIGHUP reads it again
//!   scopes: [runs:read, runs:write, tools:call, approvals:write]   # the most a token may hold
//!   name_claim: sub                   # whose name a token's calls and answers carry
//!   groups_claim: groups              # optional: the groups an approvers list may name
//! ```
//!
//! A bearer that is no API key and has a JWT's shape is checked here: signed by one of the keys
//! (by its `kid`, with the key's own algorithm; symmetric keys are refused at load), issued by
//! `issuer`, for `audience`, not expired (`exp` required, 30 s of leeway, `nbf` honoured). Its
//! scopes are the kernel's scope names among its `scope` claim (space-separated) or `scp` (a list),
//! within `scopes`; other names (`openid`, `email`) are ignored. Workers and admins use API keys:
//! a token never holds `workers:connect` or `admin`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Caller, KeyInfo, MAX_NAME_LEN, Scope};
use crate::error::KernelError;

/// The auth file's `oauth` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileOauth {
    issuer: String,
    audience: String,
    jwks_file: PathBuf,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    name_claim: Option<String>,
    #[serde(default)]
    groups_claim: Option<String>,
}

/// The scopes a token may hold when the file names none: an MCP client's, and a person's answer.
const DEFAULT_SCOPES: [Scope; 4] = [
    Scope::RunsRead,
    Scope::RunsWrite,
    Scope::ToolsCall,
    Scope::ApprovalsWrite,
];

/// Seconds of clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;

/// The authorization server whose tokens the kernel accepts.
#[derive(Debug)]
pub struct Oauth {
    issuer: String,
    audience: String,
    keys: Vec<ServerKey>,
    ceiling: HashSet<Scope>,
    name_claim: String,
    groups_claim: Option<String>,
}

/// One of the server's public keys.
struct ServerKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

impl std::fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerKey")
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

impl Oauth {
    /// The section as the kernel applies it, its `jwks_file` read relative to `base` (the auth
    /// file's folder).
    pub(super) fn load(file: FileOauth, base: &Path) -> Result<Oauth, String> {
        let at = |field: &str, message: String| format!("oauth.{field}: {message}");
        let issuer = non_empty(file.issuer).ok_or_else(|| at("issuer", "must not be empty".into()))?;
        let audience = non_empty(file.audience).ok_or_else(|| at("audience", "must not be empty".into()))?;
        let path = base.join(&file.jwks_file);
        let text = std::fs::read_to_string(&path).map_err(|e| at("jwks_file", format!("{}: {e}", path.display())))?;
        let set: JwkSet = serde_json::from_str(&text)
            .map_err(|e| at("jwks_file", format!("{}: not a JWK Set: {e}", path.display())))?;
        let keys = set
            .keys
            .iter()
            .enumerate()
            .map(|(index, jwk)| server_key(jwk).map_err(|m| at("jwks_file", format!("keys[{index}]: {m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(at("jwks_file", format!("{}: holds no key", path.display())));
        }
        let ceiling = match file.scopes {
            None => DEFAULT_SCOPES.into_iter().collect(),
            Some(names) => {
                let mut ceiling = HashSet::new();
                for name in names {
                    let scope = name.parse::<Scope>().map_err(|m| at("scopes", m))?;
                    if matches!(scope, Scope::WorkersConnect | Scope::Admin) {
                        return Err(at(
                            "scopes",
                            format!("a token may not hold {scope}: workers and admins use API keys"),
                        ));
                    }
                    ceiling.insert(scope);
                }
                ceiling
            }
        };
        Ok(Oauth {
            issuer,
            audience,
            keys,
            ceiling,
            name_claim: file.name_claim.and_then(non_empty).unwrap_or_else(|| "sub".into()),
            groups_claim: file.groups_claim.and_then(non_empty),
        })
    }

    /// The server tokens must come from (`iss`).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// This kernel, as the resource tokens must be for (`aud`).
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// How many public keys the server's set holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The caller a token speaks for; `Unauthenticated` saying why when it is refused. `taken`
    /// says whether a name belongs to an API key: a token may not speak under a key's name.
    pub(super) fn caller(&self, token: &str, taken: impl Fn(&str) -> bool) -> Result<Caller, KernelError> {
        let refused = |why: String| KernelError::Unauthenticated(format!("access token refused: {why}"));
        let header = jsonwebtoken::decode_header(token).map_err(|e| refused(format!("not a JWT: {e}")))?;
        // A token names its key (`kid`); one without may only be checked against a set of one.
        let key = match &header.kid {
            Some(kid) => self.keys.iter().find(|key| key.kid.as_deref() == Some(kid.as_str())),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
        .ok_or_else(|| refused("signed with a key the authorization server's set does not hold".into()))?;
        if header.alg != key.algorithm {
            return Err(refused(format!(
                "signed with {:?}, but its key is for {:?}",
                header.alg, key.algorithm
            )));
        }
        let mut validation = Validation::new(key.algorithm);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECS;
        let claims = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key.key, &validation)
            .map_err(|e| refused(why(e.kind())))?
            .claims;
        let name = claims
            .get(&self.name_claim)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty() && n.len() <= MAX_NAME_LEN && !n.chars().any(char::is_control))
            .ok_or_else(|| refused(format!("no usable '{}' claim to name its holder", self.name_claim)))?
            .to_owned();
        if taken(&name) {
            return Err(refused(format!("'{name}' is an API key's name")));
        }
        Ok(Caller(Arc::new(KeyInfo {
            digest: Sha256::digest(token.as_bytes()).into(),
            name,
            scopes: self.scopes_of(&claims),
            tools: None,
            grants: None,
            groups: self.groups_of(&claims),
        })))
    }

    fn scopes_of(&self, claims: &serde_json::Map<String, Value>) -> HashSet<Scope> {
        let names: Vec<&str> = match (claims.get("scope"), claims.get("scp")) {
            (Some(Value::String(scope)), _) => scope.split_whitespace().collect(),
            (_, Some(Value::Array(scp))) => scp.iter().filter_map(Value::as_str).collect(),
            (_, Some(Value::String(scp))) => scp.split_whitespace().collect(),
            _ => Vec::new(),
        };
        names
            .into_iter()
            .filter_map(|name| name.parse::<Scope>().ok())
            .filter(|scope| self.ceiling.contains(scope))
            .collect()
    }

    fn groups_of(&self, claims: &serde_json::Map<String, Value>) -> Vec<String> {
        let Some(claim) = &self.groups_claim else {
            return Vec::new();
        };
        match claims.get(claim) {
            Some(Value::Array(groups)) => groups
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .filter(|g| !g.is_empty() && g.len() <= MAX_NAME_LEN && !g.chars().any(char::is_control))
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether `secret` has a JWT's shape: three dot-separated parts.
pub(super) fn looks_like_a_token(secret: &str) -> bool {
    secret.split('.').count() == 3
}

fn non_empty(text: String) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A public key of the server's set, with the one algorithm it verifies.
fn server_key(jwk: &Jwk) -> Result<ServerKey, String> {
    let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::OctetKey(_), _) => {
            return Err(
                "a symmetric key; only an authorization server's public keys (RSA, EC, OKP) verify tokens".into(),
            );
        }
        (_, Some(declared)) => declared
            .to_string()
            .parse::<Algorithm>()
            .map_err(|_| format!("declares {declared}, which is no signature algorithm"))?,
        (AlgorithmParameters::RSA(_), None) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), None) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return Err("an EC key on a curve this kernel does not verify with (P-256, P-384)".into()),
        },
        (AlgorithmParameters::OctetKeyPair(_), None) => Algorithm::EdDSA,
        (_, None) => return Err("a key type this kernel does not verify with".into()),
    };
    if matches!(algorithm, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
        return Err("declares an HMAC algorithm; only public keys verify tokens".into());
    }
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("not a usable key: {e}"))?;
    Ok(ServerKey {
        kid: jwk.common.key_id.clone(),
        algorithm,
        key,
    })
}

/// Why a token was refused, in words a client's operator can act on.
fn why(kind: &jsonwebtoken::errors::ErrorKind) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::ExpiredSignature => "expired".into(),
        ErrorKind::ImmatureSignature => "not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "issued for another resource (aud)".into(),
        ErrorKind::InvalidIssuer => "issued by another authorization server (iss)".into(),
        ErrorKind::InvalidSignature => "its signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("it has no '{claim}' claim"),
        ErrorKind::InvalidAlgorithm => "signed with another algorithm than its key's".into(),
        other => format!("{other:?}"),
    }
}

/// Where an auth file's relative paths start: its folder.
pub(super) fn base_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}
