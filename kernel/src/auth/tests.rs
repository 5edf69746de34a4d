use prost::Message;
use tonic::Code;
use tonic::Status;

use super::*;

fn ring(yaml: &str) -> KeyRing {
    KeyRing::from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn file() -> String {
    format!(
        r#"
keys:
  - name: reader
    sha256: {reader}
    scopes: [runs:read]
  - name: billing-worker
    sha256: "{worker}"
    scopes: ["workers:connect"]
    tools: ["refund*", "billing_*"]
  - name: root
    sha256: {root}
    scopes: [admin]
"#,
        reader = secret_digest_hex("r-secret"),
        worker = secret_digest_hex("w-secret"),
        root = secret_digest_hex("root-secret"),
    )
}

fn bearer(secret: &str) -> Vec<u8> {
    format!("Bearer {secret}").into_bytes()
}

#[test]
fn the_file_parses_names_scopes_and_tools() {
    let keys = ring(&file());
    assert_eq!(keys.len(), 3);
    let reader = keys.authenticate("r-secret").expect("reader");
    assert_eq!(reader.name(), "reader");
    assert!(reader.has(Scope::RunsRead));
    assert!(!reader.has(Scope::RunsWrite));
    let root = keys.authenticate("root-secret").expect("root");
    assert!(Scope::ALL.iter().all(|s| root.has(*s)), "admin implies every scope");
}

#[test]
fn only_the_exact_secret_matches() {
    let keys = ring(&file());
    assert!(keys.authenticate("r-secret").is_some());
    for wrong in ["", "r-secre", "r-secret ", "R-SECRET", &secret_digest_hex("r-secret")] {
        assert!(keys.authenticate(wrong).is_none(), "{wrong:?}");
    }
}

#[test]
fn digests_compare_whole() {
    let a = [7u8; 32];
    let mut b = a;
    assert!(digests_equal(&a, &b));
    b[31] ^= 1;
    assert!(!digests_equal(&a, &b));
    b = a;
    b[0] ^= 0x80;
    assert!(!digests_equal(&a, &b));
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let digest = secret_digest_hex("x");
    let cases = [
        ("keys: [{name: a, sha256: abc, scopes: [admin]}]".to_owned(), "64 hex"),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: [root]}}]"),
            "unknown scope 'root'",
        ),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: []}}]"),
            "at least one scope",
        ),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: [workers:connect]}}]"),
            "must list the tools",
        ),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: [runs:read], tools: ['*']}}]"),
            "only to keys with workers:connect",
        ),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: [admin], secret: x}}]"),
            "unknown field",
        ),
        (
            format!(
                "keys: [{{name: a, sha256: {digest}, scopes: [admin]}}, {{name: a, sha256: {}, scopes: [admin]}}]",
                secret_digest_hex("y")
            ),
            "used twice",
        ),
        (
            format!(
                "keys: [{{name: a, sha256: {digest}, scopes: [admin]}}, {{name: b, sha256: {digest}, scopes: [admin]}}]"
            ),
            "listed twice",
        ),
        (
            format!("keys: [{{name: a, sha256: {digest}, scopes: [workers:connect], tools: ['']}}]"),
            "empty glob",
        ),
        (
            format!("keys: [{{name: '', sha256: {digest}, scopes: [admin]}}]"),
            "name must be",
        ),
    ];
    for (yaml, expected) in cases {
        let error = KeyRing::from_yaml(&yaml).expect_err(&yaml);
        assert!(error.contains(expected), "{yaml}\n=> {error}");
    }
}

#[test]
fn every_kernel_method_maps_to_its_scope() {
    let expected = [
        ("/kernel.v1.RunService/GetRun", Scope::RunsRead),
        ("/kernel.v1.RunService/ListRuns", Scope::RunsRead),
        ("/kernel.v1.RunService/ListRunEvents", Scope::RunsRead),
        ("/kernel.v1.RunService/WatchRunEvents", Scope::RunsRead),
        ("/kernel.v1.RunService/ListReceipts", Scope::RunsRead),
        ("/kernel.v1.RunService/CreateRun", Scope::RunsWrite),
        ("/kernel.v1.RunService/ForkRun", Scope::RunsWrite),
        ("/kernel.v1.RunService/CompleteRun", Scope::RunsWrite),
        ("/kernel.v1.RunService/FailRun", Scope::RunsWrite),
        ("/kernel.v1.RunService/CancelRun", Scope::RunsWrite),
        ("/kernel.v1.ToolCallService/CancelCall", Scope::RunsWrite),
        ("/kernel.v1.ToolCallService/AskPerson", Scope::RunsWrite),
        ("/kernel.v1.ToolCallService/SubmitTurn", Scope::ToolsCall),
        ("/kernel.v1.ToolCallService/CallTurn", Scope::ToolsCall),
        ("/kernel.v1.ApprovalService/ListApprovals", Scope::RunsRead),
        ("/kernel.v1.ApprovalService/ApproveCall", Scope::ApprovalsWrite),
        ("/kernel.v1.ApprovalService/RejectCall", Scope::ApprovalsWrite),
        ("/kernel.v1.WorkerService/OpenSession", Scope::WorkersConnect),
        ("/kernel.v1.RegistryService/ListTools", Scope::RunsRead),
        ("/kernel.v1.RegistryService/ListWorkers", Scope::RunsRead),
        ("/kernel.v1.AdminService/ReloadPolicy", Scope::Admin),
        ("/kernel.v1.AdminService/GetStatus", Scope::Admin),
        ("/kernel.v1.RunService/SomethingNew", Scope::Admin),
    ];
    for (path, scope) in expected {
        assert_eq!(required_scope(path), scope, "{path}");
    }
}

/// Every RPC the protocol declares is mapped on purpose: a new one must be added to
/// [`required_scope`] (only `AdminService` may fall through to `admin`).
#[test]
fn no_declared_method_falls_through_to_admin_by_accident() {
    let set = prost_types::FileDescriptorSet::decode(kernel_proto::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut seen = 0;
    for file in set.file.iter().filter(|f| f.package() == "kernel.v1") {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/kernel.v1.{}/{}", service.name(), method.name());
                let scope = required_scope(&path);
                assert!(
                    scope != Scope::Admin || service.name() == "AdminService",
                    "{path} is not mapped to a scope"
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 16, "only {seen} methods in the descriptor set");
}

#[test]
fn authorize_separates_unauthenticated_from_permission_denied() {
    let keys = ring(&file());
    let get = "/kernel.v1.RunService/GetRun";
    let create = "/kernel.v1.RunService/CreateRun";
    let code = |r: Result<Caller, KernelError>| Status::from(r.unwrap_err()).code();

    assert_eq!(code(keys.authorize(get, None)), Code::Unauthenticated);
    assert_eq!(code(keys.authorize(get, Some(b"Bearer nope"))), Code::Unauthenticated);
    assert_eq!(
        code(keys.authorize(get, Some(b"Basic r-secret"))),
        Code::Unauthenticated
    );
    assert_eq!(code(keys.authorize(get, Some(b"Bearer "))), Code::Unauthenticated);
    assert_eq!(code(keys.authorize(get, Some(b"r-secret"))), Code::Unauthenticated);

    assert_eq!(keys.authorize(get, Some(&bearer("r-secret"))).unwrap().name(), "reader");
    assert!(
        keys.authorize(get, Some(b"bearer r-secret")).is_ok(),
        "the scheme is case-insensitive"
    );
    let denied = keys.authorize(create, Some(&bearer("r-secret"))).unwrap_err();
    let status = Status::from(denied);
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("'reader'") && status.message().contains("runs:write"),
        "{status:?}"
    );
    assert!(keys.authorize(create, Some(&bearer("root-secret"))).is_ok());
}

#[test]
fn worker_keys_register_only_their_globs() {
    let keys = ring(&file());
    let worker = keys.authenticate("w-secret").unwrap();
    assert!(worker.may_register("refund").is_ok());
    assert!(worker.may_register("refund_big").is_ok());
    assert!(worker.may_register("billing_report").is_ok());
    let status = Status::from(worker.may_register("rm_rf").unwrap_err());
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("'rm_rf'") && status.message().contains("'billing-worker'"),
        "{status:?}"
    );
    assert!(
        keys.authenticate("root-secret")
            .unwrap()
            .may_register("anything")
            .is_ok()
    );
    assert!(keys.authenticate("r-secret").unwrap().may_register("refund").is_err());
}

#[test]
fn an_empty_file_refuses_everyone() {
    let keys = ring("keys: []");
    assert!(keys.is_empty());
    assert!(
        keys.authorize("/kernel.v1.RunService/GetRun", Some(b"Bearer x"))
            .is_err()
    );
}

#[test]
fn a_session_stays_admitted_only_while_its_key_allows_it() {
    let before = ring(&file());
    let worker = before.authenticate("w-secret").expect("worker key");
    let offered = vec!["refund_order".to_owned(), "billing_report".to_owned()];
    assert!(before.still_admits(&worker, &offered).is_ok());

    // The same file read again admits it again: identity is the secret, not the object.
    assert!(ring(&file()).still_admits(&worker, &offered).is_ok());

    let removed = ring(
        &file()
            .replace("billing-worker", "other-worker")
            .replace(&secret_digest_hex("w-secret"), &secret_digest_hex("new-secret")),
    );
    let status = Status::from(removed.still_admits(&worker, &offered).unwrap_err());
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("billing-worker"), "{status:?}");

    let narrowed = ring(&file().replace(r#"["refund*", "billing_*"]"#, r#"["refund*"]"#));
    let status = Status::from(narrowed.still_admits(&worker, &offered).unwrap_err());
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("billing_report"), "{status:?}");

    let demoted = ring(&file().replace(
        "scopes: [\"workers:connect\"]\n    tools: [\"refund*\", \"billing_*\"]",
        "scopes: [\"runs:read\"]",
    ));
    let error = demoted.still_admits(&worker, &offered).unwrap_err();
    assert!(error.to_string().contains("workers:connect"), "{error}");
}

#[test]
fn a_reload_swaps_the_keys_and_a_bad_file_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.yaml");
    std::fs::write(&path, file()).unwrap();
    let keys = Keys::load(&path).unwrap();
    let watch = keys.watch();
    assert!(keys.current().authenticate("r-secret").is_some());

    std::fs::write(&path, "keys: [ {name: broken").unwrap();
    let error = keys.reload().unwrap_err();
    assert!(error.to_string().contains("--auth-file"), "{error}");
    assert!(
        keys.current().authenticate("r-secret").is_some(),
        "the keys in force stay"
    );
    assert!(!watch.has_changed().unwrap(), "a refused file changes nothing");

    std::fs::write(
        &path,
        file().replace(&secret_digest_hex("r-secret"), &secret_digest_hex("r2")),
    )
    .unwrap();
    assert_eq!(keys.reload().unwrap(), 3);
    assert!(watch.has_changed().unwrap());
    assert!(
        keys.current().authenticate("r-secret").is_none(),
        "the old secret is refused"
    );
    assert!(keys.current().authenticate("r2").is_some(), "the new one is in force");
}

fn governed() -> KeyRing {
    ring(&format!(
        r#"
keys:
  - name: billing-agent
    sha256: {agent}
    scopes: ["runs:write", "tools:call"]
    grants: ["billing:*", "email:send"]
  - name: plain-agent
    sha256: {plain}
    scopes: ["runs:write"]
  - name: alice
    sha256: {alice}
    scopes: ["approvals:write"]
    groups: ["payments-oncall"]
  - name: root
    sha256: {root}
    scopes: [admin]
"#,
        agent = secret_digest_hex("agent"),
        plain = secret_digest_hex("plain"),
        alice = secret_digest_hex("alice"),
        root = secret_digest_hex("root"),
    ))
}

#[test]
fn a_run_holds_only_what_its_creating_key_may_grant() {
    let keys = governed();
    let agent = keys.authenticate("agent").unwrap();
    assert!(agent.may_grant(&["billing:write".into(), "email:send".into()]).is_ok());
    let wider = agent
        .may_grant(&["billing:write".into(), "payroll:write".into()])
        .unwrap_err();
    assert!(matches!(wider, KernelError::PermissionDenied(_)));
    assert_eq!(
        wider.to_string(),
        "permissions[1]: key 'billing-agent' may not grant 'payroll:write' (its grants: billing:*, email:send)"
    );
    let plain = keys.authenticate("plain").unwrap();
    assert!(plain.may_grant(&[]).is_ok(), "no permissions asked, none needed");
    assert!(
        plain
            .may_grant(&["billing:write".into()])
            .unwrap_err()
            .to_string()
            .contains("(its grants: none)")
    );
    assert!(
        keys.authenticate("root")
            .unwrap()
            .may_grant(&["anything".into()])
            .is_ok()
    );
}

#[test]
fn only_a_listed_approver_or_group_member_may_answer() {
    let keys = governed();
    let alice = keys.authenticate("alice").unwrap();
    assert!(alice.may_answer(&[]).is_ok(), "no approvers listed: the scope suffices");
    assert!(alice.may_answer(&["alice".into()]).is_ok());
    assert!(alice.may_answer(&["bob".into(), "payments-oncall".into()]).is_ok());
    let refused = alice.may_answer(&["bob".into(), "legal".into()]).unwrap_err();
    assert!(matches!(refused, KernelError::PermissionDenied(_)));
    assert_eq!(
        refused.to_string(),
        "key 'alice' (groups payments-oncall) is not among this approval's approvers (bob, legal)"
    );
    let root = keys.authenticate("root").unwrap();
    assert!(
        root.may_answer(&["payments-oncall".into()]).is_err(),
        "a rule's approvers bind admin keys too"
    );
}

#[test]
fn grants_and_groups_are_checked_when_the_file_loads() {
    let digest = secret_digest_hex("x");
    let grants_on_a_reader =
        format!("keys:\n  - name: r\n    sha256: {digest}\n    scopes: [runs:read]\n    grants: [\"billing:*\"]\n");
    assert!(
        KeyRing::from_yaml(&grants_on_a_reader)
            .unwrap_err()
            .contains("grants apply only to keys with runs:write")
    );
    let bad_glob = format!("keys:\n  - name: a\n    sha256: {digest}\n    scopes: [runs:write]\n    grants: [\"\"]\n");
    assert!(
        KeyRing::from_yaml(&bad_glob)
            .unwrap_err()
            .contains("grants: empty glob")
    );
    let empty_group =
        format!("keys:\n  - name: a\n    sha256: {digest}\n    scopes: [approvals:write]\n    groups: [\" \"]\n");
    assert!(
        KeyRing::from_yaml(&empty_group)
            .unwrap_err()
            .contains("a group must be")
    );
}

/// Access tokens of an OAuth authorization server (`oauth:` in the auth file), signed with the
/// test keys under `tests/fixtures/oauth`.
mod oauth_tokens {
    use std::path::PathBuf;

    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use serde_json::{Value, json};

    use super::*;

    const ISSUER: &str = "https://idp.test/realms/agents";
    const AUDIENCE: &str = "https://kernel.test/mcp";

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/oauth")
    }

    fn yaml(extra: &str) -> String {
        format!(
            "keys:\n  - name: alice\n    sha256: {}\n    scopes: [admin]\noauth:\n  issuer: {ISSUER}\n  audience: {AUDIENCE}\n  jwks_file: jwks.json\n{extra}",
            secret_digest_hex("alice-secret")
        )
    }

    fn ring_with(extra: &str) -> KeyRing {
        KeyRing::from_yaml_at(&yaml(extra), &fixtures()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// The claims of a token for dana that the kernel accepts, with `changes` applied (a null
    /// removes a claim).
    fn claims(changes: Value) -> Value {
        let mut claims = json!({
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "dana",
            "exp": now() + 300,
            "scope": "openid runs:read tools:call workers:connect",
        });
        for (name, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(name);
            } else {
                claims[name] = value.clone();
            }
        }
        claims
    }

    fn signed(key_file: &str, kid: Option<&str>, claims: &Value) -> String {
        let der = std::fs::read(fixtures().join(key_file)).unwrap();
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&der)).unwrap()
    }

    fn token(changes: Value) -> String {
        signed("issuer-key.der", Some("test-issuer-1"), &claims(changes))
    }

    fn refusal(keys: &KeyRing, token: &str) -> String {
        match keys.authorize("/kernel.v1.RunService/GetRun", Some(&bearer(token))) {
            Err(KernelError::Unauthenticated(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_token_of_the_server_for_this_kernel_speaks_for_its_subject_with_the_kernel_scopes_it_holds() {
        let ring = ring_with("");
        let caller = ring
            .authorize("/kernel.v1.RunService/GetRun", Some(&bearer(&token(json!({})))))
            .unwrap();
        assert_eq!(caller.name(), "dana");
        assert!(caller.has(Scope::RunsRead) && caller.has(Scope::ToolsCall));
        assert!(
            !caller.has(Scope::WorkersConnect),
            "a token never holds workers:connect"
        );
        // Its scopes are the token's: a call it lacks the scope for is refused, naming it.
        let denied = ring.authorize("/kernel.v1.RunService/CreateRun", Some(&bearer(&token(json!({})))));
        assert!(
            matches!(&denied, Err(KernelError::PermissionDenied(m)) if m.contains("lacks scope 'runs:write'")),
            "{denied:?}"
        );
        // `scp` as a list, and the file's ceiling.
        let ring = ring_with("  scopes: [runs:read]\n  groups_claim: groups\n");
        let listed = token(json!({"scope": null, "scp": ["runs:read", "approvals:write"], "groups": ["ops"]}));
        let caller = ring
            .authorize("/kernel.v1.RunService/GetRun", Some(&bearer(&listed)))
            .unwrap();
        assert!(caller.has(Scope::RunsRead) && !caller.has(Scope::ApprovalsWrite));
        assert!(caller.may_answer(&["ops".to_owned()]).is_ok(), "its groups claim");
        // API keys still work beside tokens.
        assert_eq!(ring.authenticate("alice-secret").unwrap().name(), "alice");
    }

    #[test]
    fn a_token_that_is_not_this_servers_for_this_kernel_and_current_is_refused_saying_why() {
        let ring = ring_with("");
        let cases = [
            (token(json!({"exp": now() - 3600})), "expired"),
            (
                token(json!({"aud": "https://other.test/mcp"})),
                "issued for another resource (aud)",
            ),
            (
                token(json!({"iss": "https://evil.test"})),
                "issued by another authorization server (iss)",
            ),
            (token(json!({"exp": null})), "no 'exp' claim"),
            (token(json!({"nbf": now() + 3600})), "not valid yet"),
            (token(json!({"sub": null})), "no usable 'sub' claim"),
            (token(json!({"sub": "alice"})), "'alice' is an API key's name"),
            (
                signed("stranger-key.der", Some("test-issuer-1"), &claims(json!({}))),
                "its signature does not verify",
            ),
            (
                signed("issuer-key.der", Some("rotated-away"), &claims(json!({}))),
                "a key the authorization server's set does not hold",
            ),
        ];
        for (token, why) in cases {
            let message = refusal(&ring, &token);
            assert!(message.starts_with("access token refused: "), "{message}");
            assert!(message.contains(why), "{why}: {message}");
        }
        // HMAC signed with the public key's bytes as the secret: the algorithm is its key's or none.
        let jwks = std::fs::read(fixtures().join("jwks.json")).unwrap();
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("test-issuer-1".into());
        let forged =
            jsonwebtoken::encode(&header, &claims(json!({})), &EncodingKey::from_secret(&jwks).unwrap()).unwrap();
        assert!(refusal(&ring, &forged).contains("signed with HS256, but its key is for ES256"));
        // Without an oauth section a token is just an unknown key.
        assert_eq!(refusal(&super::ring(&file()), &token(json!({}))), "unknown API key");
    }

    #[test]
    fn an_oauth_section_that_cannot_verify_tokens_safely_does_not_load() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write(
            "hmac.json",
            r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "alg": "HS256"}]}"#,
        );
        write("empty.json", r#"{"keys": []}"#);
        let load = |extra: &str| {
            let text = format!("oauth:\n  issuer: {ISSUER}\n  audience: {AUDIENCE}\n{extra}");
            KeyRing::from_yaml_at(&text, dir.path()).unwrap_err()
        };
        assert!(load("  jwks_file: hmac.json\n").contains("keys[0]: a symmetric key"));
        assert!(load("  jwks_file: empty.json\n").contains("holds no key"));
        assert!(load("  jwks_file: missing.json\n").starts_with("oauth.jwks_file: "));
        std::fs::copy(fixtures().join("jwks.json"), dir.path().join("jwks.json")).unwrap();
        let admin = load("  jwks_file: jwks.json\n  scopes: [runs:read, admin]\n");
        assert!(admin.contains("a token may not hold admin"), "{admin}");
        let ok = KeyRing::from_yaml_at(
            &format!("oauth:\n  issuer: {ISSUER}\n  audience: {AUDIENCE}\n  jwks_file: jwks.json\n"),
            dir.path(),
        )
        .unwrap();
        assert_eq!(ok.len(), 0, "a file of tokens alone, no keys");
        assert!(!ok.is_empty() && ok.oauth().is_some(), "it refuses nothing up front");
    }
}
