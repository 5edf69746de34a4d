//! Receipts with real processes: a run's calls exported with `kernelctl runs receipts`, checked
//! offline with `kernelctl receipts verify` against the kernel's key, refused once a byte, a line
//! or the key is changed; and the same receipts after a kernel SIGKILL, signed with the same key.

use e2e::{Kernel, KernelOptions};
use serde_json::{Value, json};
use worker_sdk::{AgentClient, Call, NewRun, Outcome};

/// `kernelctl receipts verify` on `text`, with `key` when given: whether it passed, and what it said.
fn verify(kernel: &Kernel, text: &str, key: Option<&str>) -> (bool, String) {
    let file = kernel.dir.path().join("receipts.jsonl");
    std::fs::write(&file, text).unwrap();
    let path = file.to_string_lossy().into_owned();
    let mut args = vec!["receipts", "verify", path.as_str()];
    if let Some(key) = key {
        args.extend(["--key", key]);
    }
    let out = kernel.kernelctl(&args);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// The run's receipts as `runs receipts` prints them, and the key it says signed them.
fn receipts(kernel: &Kernel, run: &str) -> (String, String) {
    let out = kernel.kernelctl(&["runs", "receipts", run]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stderr);
    let key = said.trim().rsplit(' ').next().unwrap().to_owned();
    (String::from_utf8(out.stdout).unwrap(), key)
}

#[tokio::test]
async fn a_run_s_receipts_verify_offline_and_a_changed_byte_line_or_key_is_refused() {
    // A key file that does not exist yet: the kernel creates it with a new key.
    let keys = tempfile::tempdir().unwrap();
    let path = keys.path().join("receipt.key");
    let mut kernel = Kernel::start_with(KernelOptions {
        args: vec!["--receipt-key".into(), path.to_string_lossy().into_owned()],
        ..KernelOptions::default()
    });
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent.create_run(NewRun::new("audited", json!({}))).await.unwrap();
    let calls = vec![
        Call::new("sleepy", json!({"hold_ms": 1})),
        Call::new("sleepy", json!({"hold_ms": 2})),
        Call::new("no_such_tool", json!({})),
    ];
    let results = run.call_turn(0, calls).await.unwrap();
    assert_eq!(results[2].outcome, Outcome::UnknownTool);

    let (text, key) = receipts(&kernel, run.id());
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{text}");
    let first = &lines[0]["receipt"];
    assert_eq!(first["run"], run.id());
    assert_eq!(first["n"], 1);
    assert_eq!(first["prev"], "");
    assert_eq!(lines[1]["receipt"]["prev"], lines[0]["hash"]);
    let sleepy: Vec<&Value> = lines
        .iter()
        .map(|l| &l["receipt"])
        .filter(|r| r["tool"] == "sleepy")
        .collect();
    let canonical = |hold: u64| kernel_proto::receipt::sha256_hex(json!({ "hold_ms": hold }).to_string().as_bytes());
    let hashed: Vec<&str> = sleepy.iter().map(|r| r["arguments_sha256"].as_str().unwrap()).collect();
    assert!(
        hashed.contains(&canonical(1).as_str()) && hashed.contains(&canonical(2).as_str()),
        "{hashed:?}"
    );
    assert!(
        sleepy
            .iter()
            .all(|r| r["status"] == "succeeded" && r["decided_by"] == "default:allow"),
        "{sleepy:?}"
    );
    assert!(
        lines.iter().any(|l| l["receipt"]["outcome"] == "unknown_tool"),
        "{text}"
    );
    assert!(
        std::fs::read_to_string(&path).unwrap().trim().len() == 64,
        "the kernel kept its new key"
    );

    let (ok, said) = verify(&kernel, &text, Some(&key));
    assert!(ok, "{said}");
    assert_eq!(
        agent.receipts(run.id()).await.unwrap(),
        lines,
        "the Rust SDK exports the same"
    );
    assert!(said.contains(&format!("ok: 3 receipts of run {}", run.id())), "{said}");

    // A byte changed, a line gone, another key: each refused, naming the line.
    let changed = text.replacen("\"sleepy\"", "\"sleepz\"", 1);
    let (ok, said) = verify(&kernel, &changed, Some(&key));
    assert!(!ok && said.contains("line ") && said.contains("was changed"), "{said}");
    let without: String = text
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let (ok, said) = verify(&kernel, &without, Some(&key));
    assert!(
        !ok && said.contains("line 2") && said.contains("chain is broken"),
        "{said}"
    );
    let other = "11".repeat(32);
    let (ok, said) = verify(&kernel, &text, Some(&other));
    assert!(!ok && said.contains("not the key trusted"), "{said}");

    // Killed and started again, the kernel signs with the key it kept: the same receipts.
    kernel.kill9();
    kernel.restart();
    e2e::eventually("the restarted kernel to export the same receipts", || async {
        let out = kernel.kernelctl(&["runs", "receipts", run.id()]);
        let again = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && again == text {
            Ok(())
        } else {
            Err(format!("{again}{}", String::from_utf8_lossy(&out.stderr)))
        }
    })
    .await;
}

#[tokio::test]
async fn a_receipt_key_that_is_no_key_stops_the_kernel_at_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.key");
    std::fs::write(&path, "not a key\n").unwrap();
    let out = std::process::Command::new(e2e::binary("kernel"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("k.db"))
        .arg("--receipt-key")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--receipt-key") && said.contains("not 64 hex digits"),
        "{said}"
    );
}
