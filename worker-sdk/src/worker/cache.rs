//! A tool's own key/value cache, reached through [`ToolContext::cache`](crate::ToolContext::cache).
//!
//! On a worker the kernel keeps the entries in its store, namespaced by the tool of the call that
//! asks: a tool only ever sees its own keys, and entries outlive the worker process. Each request
//! travels on the worker's session stream tagged with the call's `(dispatch_id, attempt)` and a
//! request id; the session task keeps the pending replies by request id and routes each answer
//! back. A test context ([`ToolContext::for_test`](crate::ToolContext::for_test)) keeps its
//! entries in memory instead, with the same limits and the same namespacing.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::ToolError;
use crate::worker::session::{DispatchRef, Outbound};

/// How long a cache request waits for the kernel's answer before it fails retryably.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Request ids are unique within the worker process, so within each of its sessions.
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// A cache operation as it goes to the kernel.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CacheOp {
    Get {
        key: String,
    },
    Set {
        key: String,
        value_json: String,
        ttl: Option<Duration>,
    },
}

/// The kernel's answer: the value found (`None`: absent or expired; always `None` for a set),
/// or why the request was refused.
pub(crate) type CacheReply = Result<Option<String>, String>;

/// A request waiting for its answer, registered with the session task before it is sent.
#[derive(Debug)]
pub(crate) struct PendingCache {
    pub(crate) request_id: u64,
    pub(crate) reply: oneshot::Sender<CacheReply>,
}

/// Where a context's cache requests go.
#[derive(Debug, Clone)]
pub(crate) enum CacheBackend {
    /// The kernel's store, over the worker session.
    Session {
        tx: mpsc::Sender<Outbound>,
        pending: mpsc::UnboundedSender<PendingCache>,
        dispatch: DispatchRef,
    },
    /// A map in memory, shared by the clones of a test context.
    Memory(MemoryCache),
}

impl CacheBackend {
    pub(crate) fn memory() -> Self {
        CacheBackend::Memory(MemoryCache::default())
    }
}

/// Entries of a test context, keyed by `(tool, key)`. The lock is never held across an await.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemoryCache {
    entries: Arc<Mutex<HashMap<(String, String), MemoryEntry>>>,
}

#[derive(Debug)]
struct MemoryEntry {
    value_json: String,
    expires_at: Option<Instant>,
}

impl MemoryCache {
    fn get(&self, tool: &str, key: &str) -> Option<String> {
        self.get_at(tool, key, Instant::now())
    }

    /// The entry as of `now` (the clock is a parameter so tests need no paused runtime).
    fn get_at(&self, tool: &str, key: &str, now: Instant) -> Option<String> {
        let mut entries = self.entries.lock().expect("cache lock poisoned");
        let id = (tool.to_owned(), key.to_owned());
        match entries.get(&id) {
            Some(entry) if entry.expires_at.is_none_or(|at| now < at) => Some(entry.value_json.clone()),
            Some(_) => {
                entries.remove(&id);
                None
            }
            None => None,
        }
    }

    fn set(&self, tool: &str, key: String, value_json: String, ttl: Option<Duration>) {
        self.set_at(tool, key, value_json, ttl, Instant::now());
    }

    fn set_at(&self, tool: &str, key: String, value_json: String, ttl: Option<Duration>, now: Instant) {
        let entry = MemoryEntry {
            value_json,
            expires_at: ttl.map(|ttl| now + ttl),
        };
        self.entries
            .lock()
            .expect("cache lock poisoned")
            .insert((tool.to_owned(), key), entry);
    }
}

/// A tool's own key/value cache: JSON values under string keys, each with an optional time to
/// live. Get one with [`ToolContext::cache`](crate::ToolContext::cache); cloning it is cheap.
///
/// On a worker the kernel keeps the entries in its store, so they outlive the worker and are
/// shared by every worker offering the tool. They are namespaced by tool: a tool only ever sees
/// its own keys. The cache is not part of a run's recorded log; it is scratch space (exchange
/// rates, tokens, lookups) that a call may find missing at any time.
///
/// ```
/// use std::time::Duration;
/// use worker_sdk::ToolContext;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), worker_sdk::ToolError> {
/// let cache = ToolContext::for_test().cache();
/// assert_eq!(cache.get::<f64>("eur").await?, None);
/// cache.set("eur", &1.08, Some(Duration::from_secs(300))).await?;
/// assert_eq!(cache.get::<f64>("eur").await?, Some(1.08));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ToolCache {
    backend: CacheBackend,
    tool: Arc<str>,
}

impl fmt::Debug for ToolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match self.backend {
            CacheBackend::Session { .. } => "session",
            CacheBackend::Memory(_) => "memory",
        };
        f.debug_struct("ToolCache")
            .field("tool", &self.tool)
            .field("backend", &backend)
            .finish()
    }
}

impl ToolCache {
    /// The longest key, in bytes (UTF-8).
    pub const MAX_KEY_BYTES: usize = 256;
    /// The largest value, in bytes of its JSON text (1 MiB).
    pub const MAX_VALUE_BYTES: usize = 1 << 20;

    pub(crate) fn new(backend: CacheBackend, tool: Arc<str>) -> Self {
        Self { backend, tool }
    }

    /// The value kept under `key`, decoded as `T`; `None` when there is none or it expired.
    ///
    /// Fails with a fatal error for an invalid key or a value that does not decode as `T`, and
    /// with a retryable one when the kernel cannot be asked (the session was lost, the store is
    /// unavailable, no answer in time).
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ToolError> {
        let Some(text) = self.get_text(key).await? else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| ToolError::fatal(format!("cache entry '{key}' does not decode: {error}")))
    }

    /// The value kept under `key` as JSON; `None` when there is none or it expired.
    pub async fn get_value(&self, key: &str) -> Result<Option<Value>, ToolError> {
        self.get::<Value>(key).await
    }

    /// Keeps `value` under `key`, replacing what was there. With a `ttl` the entry expires after
    /// that long (a TTL under a millisecond counts as one); without, it never expires.
    ///
    /// Fails with a fatal error for an invalid key (empty or over [`ToolCache::MAX_KEY_BYTES`]) or
    /// a value that does not serialize or is over [`ToolCache::MAX_VALUE_BYTES`]; with a retryable
    /// one when the kernel cannot be asked or refuses the write.
    pub async fn set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl: Option<Duration>,
    ) -> Result<(), ToolError> {
        check_key(key)?;
        let value_json = serde_json::to_string(value)
            .map_err(|error| ToolError::fatal(format!("cache value for '{key}' does not serialize: {error}")))?;
        if value_json.len() > Self::MAX_VALUE_BYTES {
            return Err(ToolError::fatal(format!(
                "cache value for '{key}' is {} bytes, over the limit of {} bytes",
                value_json.len(),
                Self::MAX_VALUE_BYTES
            )));
        }
        let ttl = ttl.map(|ttl| ttl.max(Duration::from_millis(1)));
        match &self.backend {
            CacheBackend::Memory(memory) => {
                memory.set(&self.tool, key.to_owned(), value_json, ttl);
                Ok(())
            }
            CacheBackend::Session { .. } => {
                let op = CacheOp::Set {
                    key: key.to_owned(),
                    value_json,
                    ttl,
                };
                self.ask(op).await.map(drop)
            }
        }
    }

    async fn get_text(&self, key: &str) -> Result<Option<String>, ToolError> {
        check_key(key)?;
        match &self.backend {
            CacheBackend::Memory(memory) => Ok(memory.get(&self.tool, key)),
            CacheBackend::Session { .. } => self.ask(CacheOp::Get { key: key.to_owned() }).await,
        }
    }

    /// Sends one request on the session and waits for its answer.
    async fn ask(&self, op: CacheOp) -> Result<Option<String>, ToolError> {
        let CacheBackend::Session { tx, pending, dispatch } = &self.backend else {
            unreachable!("only a session cache asks the kernel");
        };
        // The slot on the stream is taken first and the reply registered before the request is
        // sent, so the session task always knows a request id before its answer can arrive.
        let permit = tx.reserve().await.map_err(|_| session_lost())?;
        let request_id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        pending
            .send(PendingCache { request_id, reply })
            .map_err(|_| session_lost())?;
        permit.send(Outbound::Cache {
            dispatch: dispatch.clone(),
            request_id,
            op,
        });
        match tokio::time::timeout(REPLY_TIMEOUT, answer).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(refusal))) => Err(ToolError::retryable(format!("cache request refused: {refusal}"))),
            Ok(Err(_)) => Err(session_lost()),
            Err(_) => Err(ToolError::retryable(format!(
                "cache request not answered within {}s",
                REPLY_TIMEOUT.as_secs()
            ))),
        }
    }
}

fn check_key(key: &str) -> Result<(), ToolError> {
    if key.is_empty() || key.len() > ToolCache::MAX_KEY_BYTES {
        return Err(ToolError::fatal(format!(
            "cache key must be 1 to {} bytes, got {}",
            ToolCache::MAX_KEY_BYTES,
            key.len()
        )));
    }
    Ok(())
}

fn session_lost() -> ToolError {
    ToolError::retryable("cache unavailable: the worker session to the kernel was lost")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ErrorKind;
    use crate::worker::context::ToolContext;

    #[tokio::test]
    async fn a_test_context_keeps_values_in_memory_shared_by_its_clones() {
        let ctx = ToolContext::for_test();
        let cache = ctx.cache();
        assert_eq!(cache.get::<i64>("n").await.unwrap(), None);
        cache.set("n", &7, None).await.unwrap();
        assert_eq!(ctx.clone().cache().get::<i64>("n").await.unwrap(), Some(7));
        cache.set("n", &json!({"b": [1, 2]}), None).await.unwrap();
        assert_eq!(cache.get_value("n").await.unwrap(), Some(json!({"b": [1, 2]})));
        assert_eq!(
            ToolContext::for_test().cache().get::<i64>("n").await.unwrap(),
            None,
            "a fresh test context starts empty"
        );
    }

    #[tokio::test]
    async fn entries_are_namespaced_per_tool() {
        let ctx = ToolContext::for_test();
        let rates = ctx.clone().with_tool_name("rates").cache();
        let weather = ctx.with_tool_name("weather").cache();
        rates.set("today", "1.08", None).await.unwrap();
        assert_eq!(weather.get::<String>("today").await.unwrap(), None);
        assert_eq!(rates.get::<String>("today").await.unwrap().as_deref(), Some("1.08"));
    }

    #[test]
    fn entries_expire_after_their_ttl() {
        let cache = MemoryCache::default();
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        cache.set_at("t", "short".into(), "1".into(), Some(Duration::from_secs(300)), start);
        cache.set_at("t", "forever".into(), "2".into(), None, start);
        assert_eq!(cache.get_at("t", "short", at(299)).as_deref(), Some("1"));
        assert_eq!(cache.get_at("t", "short", at(300)), None);
        assert_eq!(cache.get_at("t", "forever", at(86_700)).as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn bad_keys_values_and_types_are_fatal() {
        let cache = ToolContext::for_test().cache();
        let empty = cache.get::<i64>("").await.unwrap_err();
        assert_eq!(empty.kind(), ErrorKind::Fatal);
        assert_eq!(empty.message(), "cache key must be 1 to 256 bytes, got 0");
        let long = cache.set(&"k".repeat(257), &1, None).await.unwrap_err();
        assert_eq!(long.kind(), ErrorKind::Fatal);
        cache.set(&"k".repeat(256), &1, None).await.unwrap();

        let big = "x".repeat(ToolCache::MAX_VALUE_BYTES);
        let error = cache.set("big", &big, None).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Fatal);
        assert!(error.message().contains("over the limit of 1048576 bytes"), "{error}");

        cache.set("word", "hello", None).await.unwrap();
        let error = cache.get::<i64>("word").await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Fatal);
        assert!(
            error.message().starts_with("cache entry 'word' does not decode"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn answers_are_routed_and_a_lost_session_fails_retryably() {
        let (tx, mut outbound) = mpsc::channel(8);
        let (pending_tx, mut pending) = mpsc::unbounded_channel();
        let dispatch = DispatchRef {
            id: "d1".into(),
            attempt: 2,
        };
        let backend = CacheBackend::Session {
            tx,
            pending: pending_tx,
            dispatch: dispatch.clone(),
        };
        let cache = ToolCache::new(backend, "rates".into());

        let asking = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get::<f64>("eur").await }
        });
        let registered = pending.recv().await.unwrap();
        let Some(Outbound::Cache {
            dispatch: sent,
            request_id,
            op,
        }) = outbound.recv().await
        else {
            panic!("expected a cache request")
        };
        assert_eq!((sent, request_id), (dispatch, registered.request_id));
        assert_eq!(op, CacheOp::Get { key: "eur".into() });
        registered.reply.send(Ok(Some("1.08".into()))).unwrap();
        assert_eq!(asking.await.unwrap(), Ok(Some(1.08)));

        let setting = tokio::spawn({
            let cache = cache.clone();
            async move { cache.set("eur", &1.1, Some(Duration::from_micros(10))).await }
        });
        let registered = pending.recv().await.unwrap();
        let Some(Outbound::Cache { op, .. }) = outbound.recv().await else {
            panic!("expected a cache request")
        };
        assert_eq!(
            op,
            CacheOp::Set {
                key: "eur".into(),
                value_json: "1.1".into(),
                ttl: Some(Duration::from_millis(1)),
            }
        );
        registered.reply.send(Err("store: disk full".into())).unwrap();
        let refused = setting.await.unwrap().unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Retryable);
        assert_eq!(refused.message(), "cache request refused: store: disk full");

        let lost = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get::<f64>("eur").await }
        });
        drop(pending.recv().await.unwrap());
        let error = lost.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Retryable);
        assert!(error.message().contains("session to the kernel was lost"), "{error}");

        drop(pending);
        let error = cache.get::<f64>("eur").await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Retryable, "no session task left to answer");
    }
}
