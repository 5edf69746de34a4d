//! Where the kernel's log lines go: standard error, through a writer that cannot fail.
//!
//! A kernel started as `kernel 2>&1 | tee kernel.log` loses its reader when the pipe's other end
//! exits (Ctrl-C kills `tee` too). The default writer then fails every line with `EPIPE`, and the
//! logging layer's report of that failure (`eprintln!`) panics in whatever task logged: the signal
//! task stopped handling signals, the scheduler died. A log line that cannot be written is
//! dropped and counted here instead; `kernelctl status` and `/metrics` show the count.

use std::io::Write;
use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;

static DROPPED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Log lines that could not be written since the kernel started: the `/metrics` counter (it
/// shares its count) and `GetStatus` read it.
pub fn dropped() -> &'static Counter {
    &DROPPED
}

/// Makes a writer on standard error for each line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Line<std::io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            out: std::io::stderr(),
            dropped: DROPPED.clone(),
        }
    }
}

/// One log line on its way out: the layer writes a formatted line in one `write_all`, so one
/// failure here is one line dropped.
#[derive(Debug)]
pub struct Line<W> {
    out: W,
    dropped: Counter,
}

impl<W: Write> Write for Line<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.write_all(buf).is_err() {
            self.dropped.inc();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // A flush that fails has nothing more to lose than the line its write already counted.
        let _ = self.out.flush();
        Ok(())
    }
}

/// Installs the kernel's logging: `filter` decides what is logged, standard error receives it,
/// with colours only on a terminal.
pub fn install(filter: tracing_subscriber::EnvFilter, ansi: bool) {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .with_ansi(ansi)
        // Its report of a failed write goes through `eprintln!`, which panics on a closed stderr.
        .log_internal_errors(false)
        .init();
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use prometheus_client::metrics::counter::Counter;

    use super::Line;

    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_line_that_cannot_be_written_is_counted_and_reported_written() {
        let dropped = Counter::default();
        let mut line = Line {
            out: Closed,
            dropped: dropped.clone(),
        };
        line.write_all(b"2026-12-05 INFO stopping\n")
            .expect("the writer reports success");
        line.flush().expect("so does its flush");
        assert_eq!(dropped.get(), 1);
    }

    #[test]
    fn a_line_that_is_written_is_not_counted() {
        let dropped = Counter::default();
        let mut line = Line {
            out: Vec::new(),
            dropped: dropped.clone(),
        };
        line.write_all(b"listening\n").unwrap();
        assert_eq!(line.out, b"listening\n");
        assert_eq!(dropped.get(), 0);
    }
}
