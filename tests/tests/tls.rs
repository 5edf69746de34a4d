//! TLS end to end: a kernel serving gRPC over TLS with throwaway certificates made at test time
//! (rcgen; nothing committed), the demo worker, the demo agent, the SDK's agent client and
//! kernelctl trusting its CA; and what is refused: plaintext clients, a client trusting another
//! CA, a bad TLS file at start, and, with `--tls-client-ca`, a worker without a client certificate
//! or with one from another CA.

use std::path::PathBuf;
use std::process::{Command, Output};

use e2e::{Kernel, KernelOptions, Process, WAIT, binary, check_log};
use kernel_proto::v1 as pb;
use pb::registry_service_client::RegistryServiceClient;
use pb::run_service_client::RunServiceClient;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use worker_sdk::{AgentClient, Call, NewRun, Tls};

/// A CA and what it signed, as PEM files in a temporary folder: `ca.pem`; `server.pem` and
/// `server.key` for `localhost` and `127.0.0.1`; `worker.pem` and `worker.key`, a client
/// certificate; `named.pem` and `named.key`, a server certificate for `kernel.test` only.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).expect("write pem");

        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kernel test ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        write("ca.pem", ca.self_signed(&ca_key).expect("ca cert").pem());
        let issuer = Issuer::new(ca, ca_key);

        let leaves = [
            (
                "server",
                vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            (
                "worker",
                vec!["worker.test".to_owned()],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            (
                "named",
                vec!["kernel.test".to_owned()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
        ];
        for (name, names, usage) in leaves {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(names).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            write(
                &format!("{name}.pem"),
                params.signed_by(&key, &issuer).expect("cert").pem(),
            );
            write(&format!("{name}.key"), key.serialize_pem());
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn tls(&self) -> Tls {
        Tls::from_ca_file(self.path("ca.pem")).expect("ca file")
    }
}

/// A kernel serving TLS with the PKI's server certificate; with `client_ca`, worker sessions need
/// a client certificate signed by the PKI's CA.
fn tls_kernel(pki: &Pki, client_ca: bool) -> Kernel {
    let mut args = vec![
        "--tls-cert".to_owned(),
        pki.arg("server.pem"),
        "--tls-key".to_owned(),
        pki.arg("server.key"),
    ];
    if client_ca {
        args.extend(["--tls-client-ca".to_owned(), pki.arg("ca.pem")]);
    }
    Kernel::start_with(KernelOptions {
        args,
        ..KernelOptions::default()
    })
}

/// Starts the demo worker over TLS trusting `ca`, with extra flags; waits for nothing.
fn tls_worker(kernel: &Kernel, ca: &Pki, name: &str, extra: &[String]) -> Process {
    let mut command = Command::new(binary("demo-worker"));
    command
        .arg("--kernel")
        .arg(kernel.https_url())
        .arg("--name")
        .arg(name)
        .arg("--tls-ca")
        .arg(ca.path("ca.pem"))
        .args(extra)
        .env_remove("KERNEL_TLS_CLIENT_CERT")
        .env_remove("KERNEL_TLS_CLIENT_KEY")
        .env("RUST_LOG", "info");
    Process::start(command, "worker")
}

/// Runs kernelctl with exactly these arguments (no address added).
fn kernelctl(args: &[&str]) -> Output {
    Command::new(binary("kernelctl"))
        .args(args)
        .env_remove("KERNEL_ADDR")
        .env_remove("KERNEL_TLS_CA")
        .output()
        .expect("kernelctl runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

async fn tls_channel(kernel: &Kernel, pki: &Pki) -> Channel {
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();
    Endpoint::from_shared(kernel.https_url())
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
        .unwrap()
        .connect()
        .await
        .expect("tls channel")
}

async fn events(channel: Channel, run_id: &str) -> Vec<pb::Event> {
    let page = RunServiceClient::new(channel)
        .list_run_events(pb::ListRunEventsRequest {
            run_id: run_id.into(),
            from_seq: 1,
            page_size: 1000,
        })
        .await
        .expect("list events")
        .into_inner();
    assert_eq!(page.next_seq, 0, "one page holds the whole log");
    page.events
}

/// Runs `add` through the kernel as an agent trusting the PKI's CA, and returns the run id.
async fn add_over_tls(kernel: &Kernel, pki: &Pki) -> String {
    let agent = AgentClient::connect_tls(kernel.https_url(), pki.tls())
        .await
        .expect("agent over tls");
    let run = agent.create_run(NewRun::new("tls-agent", json!({}))).await.unwrap();
    let results = run
        .call_turn(0, vec![Call::new("add", json!({"a": 2, "b": 3}))])
        .await
        .unwrap();
    assert_eq!(results[0].content, "5");
    run.complete(json!({"sum": 5})).await.unwrap();
    run.id().to_owned()
}

#[tokio::test]
async fn a_call_runs_end_to_end_over_tls() {
    let pki = Pki::new();
    let kernel = tls_kernel(&pki, false);
    kernel.process.log.wait_for("serving over tls");
    let worker = tls_worker(&kernel, &pki, "tls-worker", &[]);
    worker.log.wait_for("worker session open");

    let run_id = add_over_tls(&kernel, &pki).await;
    let log = events(tls_channel(&kernel, &pki).await, &run_id).await;
    check_log(&log, true);
    assert!(log.iter().any(|e| e.r#type == "tool:result"));

    let https = kernel.https_url();
    let ca = pki.arg("ca.pem");
    let shown: Value = serde_json::from_str(&stdout(&kernelctl(&[
        "--addr", &https, "--tls-ca", &ca, "--json", "runs", "show", &run_id,
    ])))
    .unwrap();
    assert_eq!(shown["run"]["status"], "completed");
    assert_eq!(shown["steps"][0]["tool"], "add");
    assert_eq!(shown["steps"][0]["worker"], "tls-worker");
    let workers = stdout(&kernelctl(&["--addr", &https, "--tls-ca", &ca, "workers", "list"]));
    assert!(workers.contains("tls-worker"), "{workers}");

    // The demo agent takes --tls-ca as well.
    let agent = Command::new(binary("demo-agent"))
        .args(["--kernel", &https, "--tls-ca", &ca])
        .output()
        .expect("demo-agent runs");
    let demo_run = stdout(&agent).trim().to_owned();
    let shown = stdout(&kernelctl(&[
        "--addr", &https, "--tls-ca", &ca, "runs", "show", &demo_run,
    ]));
    assert!(shown.contains("completed"), "{shown}");
}

#[tokio::test]
async fn plaintext_and_untrusting_clients_are_refused() {
    let pki = Pki::new();
    let kernel = tls_kernel(&pki, false);

    let plaintext = match AgentClient::connect(kernel.url()).await {
        Err(_) => true,
        Ok(agent) => agent.create_run(NewRun::new("plain", json!({}))).await.is_err(),
    };
    assert!(plaintext, "a plaintext client got through to a TLS kernel");

    let other = Pki::new();
    let error = AgentClient::connect_tls(kernel.https_url(), other.tls())
        .await
        .expect_err("a client trusting another CA is refused");
    assert!(error.to_string().contains("certificate"), "{error}");

    // The SDK will not send an https address in the clear, nor TLS settings to an http one.
    let error = AgentClient::connect(kernel.https_url())
        .await
        .expect_err("https without a CA");
    assert!(error.to_string().contains("CA"), "{error}");
    let error = AgentClient::connect_tls(kernel.url(), pki.tls())
        .await
        .expect_err("TLS settings with http://");
    assert!(error.to_string().contains("https://"), "{error}");

    let https = kernel.https_url();
    let url = kernel.url();
    let ca = pki.arg("ca.pem");
    let missing_ca = kernelctl(&["--addr", &https, "tools", "list"]);
    assert_eq!(missing_ca.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing_ca.stderr).contains("--tls-ca"));
    let cleartext = kernelctl(&["--addr", &url, "tools", "list"]);
    assert_eq!(cleartext.status.code(), Some(1), "{cleartext:?}");
    let wrong_ca = kernelctl(&["--addr", &https, "--tls-ca", &other.arg("ca.pem"), "tools", "list"]);
    assert_eq!(wrong_ca.status.code(), Some(1), "{wrong_ca:?}");
    stdout(&kernelctl(&["--addr", &https, "--tls-ca", &ca, "tools", "list"]));
}

/// A client speaking the wrong protocol for the kernel is told what to change, not only the
/// raw failure (`frame with invalid size`, `broken pipe`, `InvalidContentType`).
#[tokio::test]
async fn a_client_on_the_wrong_protocol_is_told_what_to_change() {
    let pki = Pki::new();
    let kernel = tls_kernel(&pki, false);
    let url = kernel.url();
    let serves_tls = format!("the kernel at {url} serves TLS: use an https:// address");

    let cleartext = kernelctl(&["--addr", &url, "runs", "list"]);
    assert_eq!(cleartext.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&cleartext.stderr);
    assert!(stderr.contains(&format!("hint: {serves_tls}")), "{stderr}");

    let agent = match AgentClient::connect(&url).await {
        Ok(agent) => agent.create_run(NewRun::new("plain", json!({}))).await.unwrap_err(),
        Err(error) => error,
    };
    assert!(agent.to_string().contains(&serves_tls), "{agent}");

    let mut command = Command::new(binary("demo-worker"));
    command.args(["--kernel", &url, "--name", "plain"]);
    let worker = Process::start(command, "worker");
    worker.log.wait_for(&serves_tls);

    // The other way round: a TLS client on a plaintext kernel.
    let plain = Kernel::start();
    let https = format!("https://127.0.0.1:{}", plain.addr.port());
    let wrong = kernelctl(&["--addr", &https, "--tls-ca", &pki.arg("ca.pem"), "runs", "list"]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains(&format!("hint: the kernel at {https} serves plaintext")),
        "{stderr}"
    );

    // And no kernel at all.
    let nobody = kernelctl(&["--addr", "http://127.0.0.1:1", "runs", "list"]);
    let stderr = String::from_utf8_lossy(&nobody.stderr);
    assert!(
        stderr.contains("hint: is the kernel running at http://127.0.0.1:1?"),
        "{stderr}"
    );
}

#[tokio::test]
async fn worker_sessions_need_a_client_certificate_when_the_kernel_asks() {
    let pki = Pki::new();
    let kernel = tls_kernel(&pki, true);

    let mut anonymous = tls_worker(&kernel, &pki, "anonymous", &[]);
    let status = anonymous.wait_exit(WAIT).expect("a worker without a certificate stops");
    assert!(!status.success());
    anonymous.log.wait_for("client certificate");

    // A certificate from another CA fails the handshake; the worker keeps trying.
    let other = Pki::new();
    let foreign = tls_worker(
        &kernel,
        &pki,
        "foreign",
        &[
            "--tls-cert".into(),
            other.arg("worker.pem"),
            "--tls-key".into(),
            other.arg("worker.key"),
        ],
    );
    foreign.log.wait_for("reconnecting");

    let certified = tls_worker(
        &kernel,
        &pki,
        "certified",
        &[
            "--tls-cert".into(),
            pki.arg("worker.pem"),
            "--tls-key".into(),
            pki.arg("worker.key"),
        ],
    );
    certified.log.wait_for("worker session open");

    // Agents need only the CA.
    add_over_tls(&kernel, &pki).await;
    let workers = RegistryServiceClient::new(tls_channel(&kernel, &pki).await)
        .list_workers(pb::ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers;
    let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["certified"]);
    assert!(!foreign.log.text().contains("worker session open"));
}

#[tokio::test]
async fn the_sdk_can_check_the_kernel_certificate_against_another_name() {
    let pki = Pki::new();
    let kernel = Kernel::start_with(KernelOptions {
        args: vec![
            "--tls-cert".into(),
            pki.arg("named.pem"),
            "--tls-key".into(),
            pki.arg("named.key"),
        ],
        ..KernelOptions::default()
    });
    let error = AgentClient::connect_tls(kernel.https_url(), pki.tls())
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    assert!(error.to_string().contains("certificate"), "{error}");
    let agent = AgentClient::connect_tls(kernel.https_url(), pki.tls().domain_name("kernel.test"))
        .await
        .expect("the certificate names kernel.test");
    agent.create_run(NewRun::new("named", json!({}))).await.unwrap();
}

#[test]
fn a_missing_or_bad_tls_file_stops_the_kernel_naming_it() {
    let pki = Pki::new();
    std::fs::write(pki.path("junk.pem"), "not a certificate").unwrap();
    let db = pki.path("kernel.db");
    let start = |cert: &str, key: &str| {
        let mut command = Command::new(binary("kernel"));
        command.args(["--listen", "127.0.0.1:0", "--db"]).arg(&db).args([
            "--tls-cert",
            &pki.arg(cert),
            "--tls-key",
            &pki.arg(key),
        ]);
        let mut kernel = Process::start(command, "kernel");
        let status = kernel.wait_exit(WAIT).expect("the kernel stops at start");
        assert!(!status.success());
        // Its last line, which the thread reading stderr may still be catching up with.
        kernel.log.wait_for("kernel stopped")
    };

    let missing = start("missing.pem", "server.key");
    assert!(
        missing.contains("--tls-cert") && missing.contains("missing.pem"),
        "{missing}"
    );
    let junk = start("junk.pem", "server.key");
    assert!(
        junk.contains("junk.pem") && junk.contains("no PEM certificate"),
        "{junk}"
    );
    let bad_key = start("server.pem", "junk.pem");
    assert!(
        bad_key.contains("--tls-key") && bad_key.contains("junk.pem"),
        "{bad_key}"
    );
    let mismatched = start("server.pem", "worker.key");
    assert!(mismatched.contains("--tls-key"), "{mismatched}");
    assert!(
        !db.exists(),
        "the kernel touched its database before checking its TLS files"
    );

    let alone = Command::new(binary("kernel"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .args(["--tls-cert", &pki.arg("server.pem")])
        .output()
        .unwrap();
    assert_eq!(
        alone.status.code(),
        Some(2),
        "--tls-cert without --tls-key is a usage error"
    );
}

#[tokio::test]
async fn bench_runs_over_tls_with_an_api_key() {
    let pki = Pki::new();
    let key: Value = serde_json::from_str(&stdout(&kernelctl(&[
        "--json",
        "keys",
        "create",
        "--name",
        "bench",
        "--scope",
        "runs:write",
        "--scope",
        "tools:call",
        "--scope",
        "runs:read",
        "--scope",
        "workers:connect",
        "--tools",
        "bench_*",
    ])))
    .unwrap();
    let auth = pki.path("auth.yaml");
    std::fs::write(&auth, format!("keys:\n{}", key["entry"].as_str().unwrap())).unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        args: vec![
            "--tls-cert".to_owned(),
            pki.arg("server.pem"),
            "--tls-key".to_owned(),
            pki.arg("server.key"),
            "--auth-file".to_owned(),
            auth.to_str().unwrap().to_owned(),
        ],
        ..KernelOptions::default()
    });
    kernel.process.log.wait_for("serving over tls");
    let (https, ca) = (kernel.https_url(), pki.arg("ca.pem"));
    let secret = key["secret"].as_str().unwrap();
    let bench = [
        "--addr",
        &https,
        "--tls-ca",
        &ca,
        "--json",
        "bench",
        "--quick",
        "--sections",
        "sequential",
        "--sequential",
        "10",
    ];

    // Without the key the kernel refuses the benchmark before it measures anything.
    let refused = kernelctl(&bench);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.to_lowercase().contains("api key"), "{stderr}");

    let mut with_key = vec!["--api-key", secret];
    with_key.extend(bench);
    let report: Value = serde_json::from_str(&stdout(&kernelctl(&with_key))).unwrap();
    assert_eq!(report["sequential"]["calls"], 10, "{report}");
}
