//! `runs receipts RUN`: a run's calls as signed receipts, one JSON object a line; and `receipts
//! verify FILE`: checks them offline, without a kernel.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use kernel_proto::v1::ListReceiptsRequest;

use super::Output;
use crate::client::{Kernel, unary};
use crate::error::CliError;

/// Prints the receipts of `run`'s settled calls, one a line; the signing key goes to stderr.
pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>, run: String) -> Result<(), CliError> {
    let response = unary(kernel.runs.list_receipts(ListReceiptsRequest { run_id: run })).await?;
    let mut text = String::new();
    for line in &response.receipts_json {
        text.push_str(line);
        text.push('\n');
    }
    out.text(&text)?;
    eprintln!(
        "{} receipts, signed by key {}",
        response.receipts_json.len(),
        response.key
    );
    Ok(())
}

/// Checks the receipts in `file` (`-`: stdin), signed by `key` when given.
pub fn verify(file: &Path, key: Option<&str>) -> ExitCode {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(file)
    };
    let text = match text {
        Ok(text) => text,
        Err(error) => {
            eprintln!("kernelctl: {}: {error}", file.display());
            return ExitCode::from(2);
        }
    };
    match kernel_proto::receipt::verify(&text, key) {
        Ok(verified) => {
            println!(
                "ok: {} receipts of run {}, chained and signed by key {}",
                verified.count, verified.run, verified.key
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("kernelctl: {}: {why}", file.display());
            ExitCode::FAILURE
        }
    }
}
