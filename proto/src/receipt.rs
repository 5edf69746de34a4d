//! Receipts: what a kernel says each settled call of a run was, in a form a third party checks
//! offline. A receipt is one JSON object per line:
//!
//! ```text
//! {"hash":"<hex>","key":"<hex>","receipt":{...},"signature":"<hex>"}
//! ```
//!
//! `receipt` is the call's record (its `prev` the `hash` of the run's receipt before it, empty
//! for the first), `hash` the SHA-256 of the receipt's canonical JSON, `signature` the ed25519
//! signature of those 32 bytes by the kernel's key, and `key` that key's public half. A changed
//! byte anywhere breaks a hash, a link of the chain or a signature: [`verify`] says which line.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::canonical::to_canonical;

/// The version of a receipt's fields.
pub const VERSION: u64 = 1;

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Signs `receipt` (its `prev` already set) as one line: its hash, the signature of the hash, and
/// the key that signed.
pub fn sign(receipt: &Value, key: &SigningKey) -> Value {
    let digest = Sha256::digest(to_canonical(receipt).as_bytes());
    let signature = key.sign(&digest);
    json!({
        "receipt": receipt,
        "hash": hex::encode(digest),
        "signature": hex::encode(signature.to_bytes()),
        "key": hex::encode(key.verifying_key().to_bytes()),
    })
}

/// Signs each of a run's receipts in order, chaining each to the one before.
pub fn chain(receipts: Vec<Value>, key: &SigningKey) -> Vec<Value> {
    let mut prev = String::new();
    receipts
        .into_iter()
        .map(|mut receipt| {
            receipt["prev"] = Value::String(prev.clone());
            let line = sign(&receipt, key);
            prev = line["hash"].as_str().unwrap_or_default().to_owned();
            line
        })
        .collect()
}

/// What [`verify`] found intact.
#[derive(Debug, PartialEq, Eq)]
pub struct Verified {
    /// The run the receipts are of.
    pub run: String,
    /// How many receipts.
    pub count: usize,
    /// The public key that signed them, hex.
    pub key: String,
}

/// Checks receipts, one JSON object a line, as `runs receipts` prints them: each line's hash is
/// its receipt's, its signature is the hash's by its key (and that key is `trusted`, when given),
/// every line is of one run, signed by one key, and chained to the line before. `Err` names the
/// first line (from 1) that fails and why.
pub fn verify(text: &str, trusted: Option<&str>) -> Result<Verified, String> {
    let mut prev = String::new();
    let mut found: Option<Verified> = None;
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = index + 1;
        let fail = |why: String| format!("line {at}: {why}");
        let signed: Value = serde_json::from_str(line).map_err(|e| fail(format!("not JSON: {e}")))?;
        let receipt = signed
            .get("receipt")
            .filter(|r| r.is_object())
            .ok_or_else(|| fail("no receipt".into()))?;
        let field = |name: &str| signed.get(name).and_then(Value::as_str).unwrap_or_default();
        let digest = Sha256::digest(to_canonical(receipt).as_bytes());
        if hex::encode(digest) != field("hash") {
            return Err(fail("the receipt does not hash to its hash: it was changed".into()));
        }
        let key = field("key");
        if let Some(trusted) = trusted
            && !key.eq_ignore_ascii_case(trusted.trim())
        {
            return Err(fail(format!("signed by key {key}, not the key trusted ({trusted})")));
        }
        let verifying = hex::decode(key)
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .and_then(|bytes| VerifyingKey::from_bytes(&bytes).ok())
            .ok_or_else(|| fail(format!("key '{key}' is not an ed25519 public key")))?;
        let signature = hex::decode(field("signature"))
            .ok()
            .and_then(|bytes| <[u8; 64]>::try_from(bytes).ok())
            .map(|bytes| Signature::from_bytes(&bytes))
            .ok_or_else(|| fail("the signature is not 64 bytes of hex".into()))?;
        verifying
            .verify_strict(&digest, &signature)
            .map_err(|_| fail("the signature does not match the receipt's hash and key".into()))?;
        if receipt["prev"].as_str() != Some(prev.as_str()) {
            return Err(fail(
                "its prev is not the hash of the receipt before it: the chain is broken (a receipt removed, added \
                 or moved)"
                    .into(),
            ));
        }
        let run = receipt["run"].as_str().unwrap_or_default();
        match &mut found {
            None => {
                found = Some(Verified {
                    run: run.to_owned(),
                    count: 1,
                    key: key.to_ascii_lowercase(),
                });
            }
            Some(seen) if seen.run != run => return Err(fail(format!("of run {run}, not {}", seen.run))),
            Some(seen) if !seen.key.eq_ignore_ascii_case(key) => {
                return Err(fail(format!("signed by key {key}, not {}", seen.key)));
            }
            Some(seen) => seen.count += 1,
        }
        prev = field("hash").to_owned();
    }
    found.ok_or_else(|| "no receipts".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn receipts() -> String {
        let calls = (0..3)
            .map(|n| json!({"v": VERSION, "run": "r1", "n": n + 1, "step": format!("t{n}/p0"), "tool": "charge"}))
            .collect();
        chain(calls, &key(7))
            .iter()
            .map(|line| format!("{}\n", to_canonical(line)))
            .collect()
    }

    #[test]
    fn a_chain_of_signed_receipts_verifies_against_its_key() {
        let text = receipts();
        let verified = verify(&text, None).unwrap();
        assert_eq!((verified.run.as_str(), verified.count), ("r1", 3));
        let public = hex::encode(key(7).verifying_key().to_bytes());
        assert_eq!(verified.key, public);
        assert!(verify(&text, Some(&public)).is_ok());
        let other = hex::encode(key(8).verifying_key().to_bytes());
        assert!(
            verify(&text, Some(&other))
                .unwrap_err()
                .starts_with("line 1: signed by key")
        );
    }

    #[test]
    fn a_changed_byte_anywhere_breaks_verification() {
        // Two receipts: a change in the second is found past a first that verifies.
        let text: String = receipts().lines().take(2).map(|line| format!("{line}\n")).collect();
        // Every byte of every line, changed to another that keeps the line JSON where it can.
        for (at, byte) in text.bytes().enumerate() {
            if byte == b'\n' {
                continue;
            }
            let mut changed = text.clone().into_bytes();
            changed[at] = if byte == b'0' { b'1' } else { b'0' };
            let changed = String::from_utf8(changed).unwrap();
            assert!(
                verify(&changed, None).is_err(),
                "byte {at} changed and it still verifies"
            );
        }
    }

    #[test]
    fn a_receipt_removed_or_moved_breaks_the_chain() {
        let text = receipts();
        let lines: Vec<&str> = text.lines().collect();
        let without_middle = format!("{}\n{}\n", lines[0], lines[2]);
        assert!(verify(&without_middle, None).unwrap_err().contains("chain is broken"));
        let moved = format!("{}\n{}\n{}\n", lines[1], lines[0], lines[2]);
        assert!(verify(&moved, None).unwrap_err().starts_with("line 1:"));
        assert_eq!(verify("", None).unwrap_err(), "no receipts");
    }
}
