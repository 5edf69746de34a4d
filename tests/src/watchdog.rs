//! A time limit per test, which `cargo test` does not have: a test that hangs would hold CI until
//! its own limit, saying nothing of which test it was. Every process the harness starts counts
//! towards the test that started it (libtest names each test's thread after the test); a test
//! whose processes have run longer than the limit ends the whole suite, naming the test, after
//! killing every process the harness started. `E2E_TEST_TIMEOUT_S` sets the limit (600 s).

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Set to the per-test limit in seconds.
pub const LIMIT_VAR: &str = "E2E_TEST_TIMEOUT_S";
const DEFAULT_LIMIT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Watched {
    /// By test: when its first live process started, and how many of its processes live.
    tests: HashMap<String, (Instant, usize)>,
    /// Every live process the harness started, by pid.
    pids: HashMap<u32, String>,
}

fn watched() -> &'static Mutex<Watched> {
    static WATCHED: OnceLock<Mutex<Watched>> = OnceLock::new();
    WATCHED.get_or_init(|| {
        let limit = std::env::var(LIMIT_VAR)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        std::thread::Builder::new()
            .name("e2e-watchdog".into())
            .spawn(move || watch(limit))
            .expect("the watchdog thread starts");
        Mutex::default()
    })
}

/// Counts the process `pid`, just started, towards the current test; returns the test's name.
pub(crate) fn started(pid: u32) -> String {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let mut watched = watched().lock().unwrap();
    watched.tests.entry(test.clone()).or_insert((Instant::now(), 0)).1 += 1;
    watched.pids.insert(pid, test.clone());
    test
}

/// The process `pid` of `test` is gone.
pub(crate) fn ended(pid: u32, test: &str) {
    let mut watched = watched().lock().unwrap();
    watched.pids.remove(&pid);
    if let Some((_, live)) = watched.tests.get_mut(test) {
        *live -= 1;
        if *live == 0 {
            watched.tests.remove(test);
        }
    }
}

fn watch(limit: Duration) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let watched = watched().lock().unwrap();
        let Some((test, since)) = watched
            .tests
            .iter()
            .find(|(_, (since, _))| since.elapsed() > limit)
            .map(|(test, (since, _))| (test.clone(), *since))
        else {
            continue;
        };
        // Not `eprintln!`: the harness captures that for the test thread that started this one.
        let _ = writeln!(
            std::io::stderr(),
            "e2e: {test} has run for {} s, over the per-test limit of {} s ({LIMIT_VAR}); \
             killing the {} processes the suite started and stopping",
            since.elapsed().as_secs(),
            limit.as_secs(),
            watched.pids.len()
        );
        for pid in watched.pids.keys() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        std::process::exit(101);
    }
}
