//! What a worker says when its program installed no `tracing` subscriber: a worker is a
//! program's main loop, like a server, and one that prints nothing leaves its user guessing why a
//! call waits (a wrong address, a refused key). As uvicorn does for its own loggers, the first
//! [`crate::Worker::run`] of a program without a subscriber installs one that prints to stderr the
//! SDK's lines about its sessions (connected, cannot reach the kernel, draining, stopped) at info,
//! its lines about each call and everything else from warn (`RUST_LOG` sets the levels). A program that installs its own subscriber first gets exactly what it
//! configured.

use std::io::IsTerminal;

use tracing::{Level, Subscriber};
use tracing_subscriber::filter::{self, FilterExt};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the default subscriber unless the program has one.
pub(crate) fn show_by_default() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let levels = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LEVELS));
    let subscriber = default_subscriber(levels, std::io::stderr, std::io::stderr().is_terminal());
    // Another thread may have installed one meanwhile: then that one stays.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The SDK's lines at info, everything else at warn, unless `RUST_LOG` says otherwise.
const DEFAULT_LEVELS: &str = "warn,worker_sdk=info";

/// What `levels` lets through, except one line per call or per hosted run (inside the `dispatch`
/// and `run` spans) below warn, which a busy worker would print thousands of a second.
fn default_subscriber<W>(levels: EnvFilter, writer: W, ansi: bool) -> impl Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let not_per_call = filter::dynamic_filter_fn(|metadata, context| {
        metadata.is_span()
            || *metadata.level() <= Level::WARN
            || !context
                .lookup_current()
                .is_some_and(|span| span.scope().any(|s| matches!(s.name(), "dispatch" | "run")))
    });
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        // Its report of a failed write panics on a closed stderr; a worker must not die of its logs.
        .log_internal_errors(false)
        .with_filter(levels.and(not_per_call));
    tracing_subscriber::registry().with(layer)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_shows_session_lines_and_warnings_but_not_a_line_per_call() {
        let lines = Lines::default();
        let writer = lines.clone();
        let levels = tracing_subscriber::EnvFilter::new(super::DEFAULT_LEVELS);
        let subscriber = super::default_subscriber(levels, move || writer.clone(), false);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "worker_sdk::worker::session", "worker session open");
            tracing::warn!(target: "worker_sdk::worker", "cannot reach the kernel, reconnecting");
            tracing::info!(target: "h2::proto", "a dependency's chatter");
            let _call = tracing::info_span!(target: "worker_sdk::worker::session", "dispatch").entered();
            tracing::info!(target: "worker_sdk::worker::session", "dispatch succeeded");
            tracing::warn!(target: "worker_sdk::worker::session", "result not recorded");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("worker session open"), "{text}");
        assert!(text.contains("cannot reach the kernel"), "{text}");
        assert!(text.contains("result not recorded"), "{text}");
        assert!(!text.contains("dispatch succeeded"), "{text}");
        assert!(!text.contains("chatter"), "{text}");
    }
}
