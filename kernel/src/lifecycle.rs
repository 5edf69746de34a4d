//! The kernel's life after it starts: serving, then draining, then stopped; and the long-lived
//! tasks it cannot serve without.
//!
//! A stop is asked for (SIGTERM, SIGINT, the caller of [`crate::server::run`]) by cancelling the
//! `draining` token: health turns to not-serving, new turns and worker sessions are refused and
//! the scheduler starts nothing new, while calls running on workers finish and their results reach
//! the turns waiting for them. Then `shutdown` is cancelled and every loop and stream ends.
//!
//! The scheduler, the store's writer, the timers, the listeners and the cluster's tasks are
//! spawned through [`Lifecycle::spawn`]. One that ends before `shutdown` (a panic, a loop that
//! returned) leaves a kernel that answers health checks but cannot do its work, so its end is a
//! failure: the kernel stops at once, without draining, and exits non-zero naming the task, for
//! a supervisor to restart it and recovery to settle what was in flight.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// A long-lived task that ended while the kernel still served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the kernel's {task} task {how}")]
pub struct TaskFailure {
    /// The task, as logs and the exit line name it (`scheduler`, `store writer`).
    pub task: &'static str,
    /// How it ended: `panicked: ...`, `returned`.
    pub how: String,
}

/// The kernel's stop tokens and its record of a failed task; clones share them.
#[derive(Clone, Debug)]
pub struct Lifecycle {
    draining: CancellationToken,
    shutdown: CancellationToken,
    failure: Arc<OnceLock<TaskFailure>>,
}

impl Lifecycle {
    /// A kernel that drains once `draining` is cancelled.
    pub fn new(draining: CancellationToken) -> Lifecycle {
        Lifecycle {
            draining,
            shutdown: CancellationToken::new(),
            failure: Arc::default(),
        }
    }

    /// Cancelled when the kernel stops taking new work (a stop was asked for, or a task failed).
    pub fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// Cancelled when every loop and stream must end.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The first task that ended while the kernel served, if one did.
    pub fn failure(&self) -> Option<&TaskFailure> {
        self.failure.get()
    }

    /// Runs `future` as the long-lived task `task`: if it ends before shutdown, the kernel stops.
    pub fn spawn<F>(&self, task: &'static str, future: F)
    where
        F: Future + Send + 'static,
        F::Output: Ended + Send,
    {
        let handle = tokio::spawn(future);
        let lifecycle = self.clone();
        tokio::spawn(async move {
            let how = match handle.await {
                Ok(ended) => ended.how(),
                Err(error) if error.is_panic() => format!("panicked: {}", panic_message(error.into_panic())),
                Err(_) => "was cancelled".to_owned(),
            };
            lifecycle.ended(task, how);
        });
    }

    /// Watches a task that is not a tokio task (a thread): `ended` completes when it ends.
    pub fn watch<F>(&self, task: &'static str, ended: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let lifecycle = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = lifecycle.shutdown.cancelled() => {}
                _ = ended => lifecycle.ended(task, "exited".to_owned()),
            }
        });
    }

    fn ended(&self, task: &'static str, how: String) {
        if self.shutdown.is_cancelled() {
            return;
        }
        let failure = TaskFailure { task, how };
        if self.failure.set(failure.clone()).is_ok() {
            tracing::error!(
                task,
                how = failure.how,
                "a task of the kernel ended while it served; stopping"
            );
        }
        self.draining.cancel();
    }
}

/// What a task's end says about how it ended.
pub trait Ended {
    /// How the task ended, for the log and the exit line.
    fn how(self) -> String;
}

impl Ended for () {
    fn how(self) -> String {
        "returned".to_owned()
    }
}

impl<E: std::fmt::Display> Ended for Result<(), E> {
    fn how(self) -> String {
        match self {
            Ok(()) => "returned".to_owned(),
            Err(error) => format!("failed: {error}"),
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload.downcast::<&'static str>().map_or_else(
            |_| "a panic without a message".to_owned(),
            |message| (*message).to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::{Lifecycle, TaskFailure};

    #[tokio::test]
    async fn a_task_that_panics_stops_the_kernel_and_is_named() {
        let lifecycle = Lifecycle::new(CancellationToken::new());
        lifecycle.spawn("scheduler", async {
            let index = std::hint::black_box(3);
            assert!(index < 2, "index out of bounds");
        });
        tokio::time::timeout(Duration::from_secs(10), lifecycle.draining().cancelled())
            .await
            .expect("the kernel drains at once");
        assert_eq!(
            lifecycle.failure(),
            Some(&TaskFailure {
                task: "scheduler",
                how: "panicked: index out of bounds".into()
            })
        );
        assert_eq!(
            lifecycle.failure().unwrap().to_string(),
            "the kernel's scheduler task panicked: index out of bounds"
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_while_serving_stops_the_kernel() {
        let lifecycle = Lifecycle::new(CancellationToken::new());
        lifecycle.spawn("cache purge", async {});
        tokio::time::timeout(Duration::from_secs(10), lifecycle.draining().cancelled())
            .await
            .expect("the kernel drains at once");
        assert_eq!(lifecycle.failure().map(|f| f.how.as_str()), Some("returned"));
    }

    #[tokio::test]
    async fn a_task_that_fails_is_named_with_its_error() {
        let lifecycle = Lifecycle::new(CancellationToken::new());
        lifecycle.spawn("http listener", async { Err::<(), _>("accept: too many open files") });
        tokio::time::timeout(Duration::from_secs(10), lifecycle.draining().cancelled())
            .await
            .expect("the kernel drains at once");
        assert_eq!(
            lifecycle.failure().unwrap().to_string(),
            "the kernel's http listener task failed: accept: too many open files"
        );
    }

    #[tokio::test]
    async fn a_watched_thread_that_exits_stops_the_kernel_and_the_first_failure_is_kept() {
        let lifecycle = Lifecycle::new(CancellationToken::new());
        let (exited, ended) = tokio::sync::oneshot::channel::<()>();
        lifecycle.watch("store writer", async move {
            let _ = ended.await;
        });
        drop(exited);
        tokio::time::timeout(Duration::from_secs(10), lifecycle.draining().cancelled())
            .await
            .expect("the kernel drains at once");
        lifecycle.spawn("scheduler", async {
            let later = std::hint::black_box(true);
            assert!(!later, "later");
        });
        tokio::task::yield_now().await;
        assert_eq!(lifecycle.failure().map(|f| f.task), Some("store writer"));
    }

    #[tokio::test]
    async fn tasks_that_end_at_shutdown_are_no_failure() {
        let draining = CancellationToken::new();
        let lifecycle = Lifecycle::new(draining.clone());
        let shutdown = lifecycle.shutdown().clone();
        let (done, finished) = tokio::sync::oneshot::channel();
        lifecycle.spawn("timer", async move {
            shutdown.cancelled().await;
            let _ = done.send(());
        });
        draining.cancel();
        lifecycle.shutdown().cancel();
        finished.await.unwrap();
        // The monitor runs after the task's end; give it the turns it needs.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lifecycle.failure(), None);
    }
}
