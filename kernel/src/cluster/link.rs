//! The link between replicas: how a write of a run reaches the replica that owns the run's shard
//! ([`crate::store::forward`]). Each replica serves `kernel.replica.v1.LinkService` on its gRPC
//! port and dials the others at the address their row advertises, showing the cluster's link key
//! (drawn once by the database, so only those who can read the database can write through a
//! replica's link).
//!
//! A sender that finds no owner for a shard (its owner stopped and no replica took it over yet),
//! cannot reach the one it knows, or hears that the shard moved, reads the shards again and
//! retries, for at most [`Links::new`]'s `wait`. It never sends a write twice once the owner may
//! have received it: an answer lost on the way is the caller's `UNAVAILABLE`, as a commit cut off
//! is.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kernel_proto::replica::link_service_client::LinkServiceClient;
use kernel_proto::replica::link_service_server::LinkService;
use kernel_proto::replica::{ForwardRequest, ForwardResponse};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Response, Status};
use tracing::{debug, warn};

use super::shards::{SHARDS, ShardMap, ShardRow};
use crate::error::KernelError;
use crate::store::forward::{Bytes, Forwarded, Router, Sent};
use crate::store::{ReplicaRow, Store};

/// The metadata a link request carries the cluster's key in.
const KEY_HEADER: &str = "x-kernel-link-key";

/// How long a sender waits between looks when a shard has no owner it can reach.
const RETRY_AFTER: Duration = Duration::from_millis(50);

/// This replica's view of who owns what, and its open links.
#[derive(Clone)]
pub struct Links(Arc<Inner>);

struct Inner {
    me: String,
    owned: ShardMap,
    view: Mutex<View>,
    clients: Mutex<HashMap<String, LinkServiceClient<Channel>>>,
    key: String,
    store: Store,
    /// How long a write waits for its shard to have an owner that answers.
    wait: Duration,
    /// How long one owner has to answer (a lease TTL): one that does not is frozen or cut off,
    /// and its shards move within about as long.
    patience: Duration,
    tls: Option<ClientTlsConfig>,
    next_home: AtomicUsize,
    /// Counts the changes of any shard's owner this replica has learnt of.
    moves: tokio::sync::watch::Sender<u64>,
    /// When the shards were last read for a write this replica was sent but does not know it
    /// owns; one reading at a time.
    read_for_write: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

/// How long a reading of the shards answers every write sent for a shard this replica was not
/// known to own: a replica handed many shards reads the table once, not once per write.
const REREAD_AFTER: Duration = Duration::from_millis(20);

/// Each shard's owner, and where each replica is reached, as last read.
#[derive(Default)]
struct View {
    owners: Vec<Option<String>>,
    addresses: HashMap<String, String>,
}

impl Links {
    /// The links of the replica `store` writes for, owning what `owned` says; a write waits at
    /// most `wait` for its shard's owner, which has `patience` to answer. `tls` is how to dial the
    /// others when they serve TLS.
    pub async fn new(
        store: Store,
        owned: ShardMap,
        (wait, patience): (Duration, Duration),
        tls: Option<ClientTlsConfig>,
    ) -> Result<Links, KernelError> {
        let key = store.reads.link_key().await?;
        Ok(Links(Arc::new(Inner {
            me: store.replica().to_owned(),
            owned,
            view: Mutex::new(View::default()),
            clients: Mutex::new(HashMap::new()),
            key,
            store,
            wait,
            patience,
            tls,
            next_home: AtomicUsize::new(0),
            moves: tokio::sync::watch::Sender::new(0),
            read_for_write: tokio::sync::Mutex::new(None),
        })))
    }

    /// Takes in the shards' and replicas' rows as just read.
    pub fn learn(&self, shards: &[ShardRow], replicas: &[ReplicaRow]) {
        let mut owners = vec![None; SHARDS as usize];
        for row in shards {
            if let Some(slot) = owners.get_mut(row.id as usize) {
                slot.clone_from(&row.owner);
            }
        }
        let mut view = self.0.view.lock().expect("link view poisoned");
        let moved = view.owners != owners;
        view.owners = owners;
        view.addresses = replicas
            .iter()
            .filter(|row| !row.address.is_empty())
            .map(|row| (row.id.clone(), row.address.clone()))
            .collect();
        drop(view);
        if moved {
            self.0.moves.send_modify(|count| *count += 1);
        }
    }

    /// Changes whenever a shard's owner changes, as this replica learns of it.
    pub fn moves(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.moves.subscribe()
    }

    /// Reads the shards and replicas again: who owns what, and what this replica owns (a shard
    /// another handed it is written here before this replica's next beat).
    async fn refresh(&self) {
        let reads = &self.0.store.reads;
        match (reads.shards().await, reads.replicas().await) {
            (Ok(shards), Ok(replicas)) => {
                self.0.owned.refresh(&shards, &self.0.me);
                self.learn(&shards, &replicas);
            }
            (Err(error), _) | (_, Err(error)) => debug!(%error, "cannot read who owns the shards"),
        }
    }

    /// Whether this replica owns `shard`, which another replica sent a write for: when not known,
    /// the shards are read again (it may have just been handed it).
    async fn owns_sent(&self, shard: u32) -> bool {
        if self.0.owned.owns(shard) {
            return true;
        }
        let mut read_at = self.0.read_for_write.lock().await;
        if read_at.is_none_or(|at| at.elapsed() >= REREAD_AFTER) {
            self.refresh().await;
            *read_at = Some(tokio::time::Instant::now());
        }
        self.0.owned.owns(shard)
    }

    /// The address of `shard`'s owner, when it is another replica this one knows how to reach.
    fn owner(&self, shard: u32) -> Option<(String, String)> {
        let view = self.0.view.lock().expect("link view poisoned");
        let owner = view.owners.get(shard as usize)?.clone()?;
        if owner == self.0.me {
            return None;
        }
        let address = view.addresses.get(&owner)?.clone();
        Some((owner, address))
    }

    /// The client of the replica at `address`, dialled when first needed.
    async fn client(&self, address: &str) -> Result<LinkServiceClient<Channel>, tonic::transport::Error> {
        if let Some(client) = self.0.clients.lock().expect("link clients poisoned").get(address) {
            return Ok(client.clone());
        }
        let scheme = if self.0.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))?
            .connect_timeout(self.0.patience)
            .timeout(self.0.patience)
            .tcp_nodelay(true);
        if let Some(tls) = &self.0.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let client = LinkServiceClient::new(endpoint.connect().await?).max_decoding_message_size(usize::MAX);
        self.0
            .clients
            .lock()
            .expect("link clients poisoned")
            .insert(address.to_owned(), client.clone());
        Ok(client)
    }

    fn forget_client(&self, address: &str) {
        self.0.clients.lock().expect("link clients poisoned").remove(address);
    }

    async fn send_to_owner(&self, shard: u32, command: Bytes) -> Result<Sent, KernelError> {
        let deadline = tokio::time::Instant::now() + self.0.wait;
        loop {
            if self.0.owned.owns(shard) {
                return Ok(Sent::Here);
            }
            if let Some((owner, address)) = self.owner(shard) {
                match self.client(&address).await {
                    Ok(mut client) => {
                        let mut request = Request::new(ForwardRequest {
                            command: command.clone(),
                            from_replica: self.0.me.clone(),
                        });
                        request.metadata_mut().insert(
                            KEY_HEADER,
                            MetadataValue::try_from(self.0.key.as_str()).expect("the link key is ascii"),
                        );
                        crate::metrics::get().forwarded.inc();
                        match client.forward(request).await {
                            Ok(response) => return Ok(Sent::Answered(response.into_inner().reply)),
                            // Refused before anything was applied: the shard is not the owner's now.
                            Err(status) if status.code() == Code::Aborted => {
                                debug!(shard, owner, "shard moved; asking again");
                            }
                            Err(status) => {
                                self.forget_client(&address);
                                return Err(KernelError::Unavailable(format!(
                                    "replica {owner} at {address}, which owns the run's shard {shard}, did not \
                                     answer: {}",
                                    status.message()
                                )));
                            }
                        }
                    }
                    Err(error) => {
                        debug!(shard, owner, address, %error, "cannot reach the shard's owner");
                        self.forget_client(&address);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KernelError::Unavailable(format!(
                    "no replica that owns shard {shard} answered within {} ms: try again",
                    self.0.wait.as_millis()
                )));
            }
            tokio::time::sleep(RETRY_AFTER).await;
            self.refresh().await;
        }
    }

    /// Whether `request` shows the cluster's key.
    fn admits<T>(&self, request: &Request<T>) -> bool {
        let shown = request
            .metadata()
            .get(KEY_HEADER)
            .map(|value| value.as_bytes())
            .unwrap_or_default();
        let key = self.0.key.as_bytes();
        // Compared in time independent of where they differ.
        shown.len() == key.len() && shown.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl Router for Links {
    fn epoch(&self, shard: u32) -> Option<i64> {
        self.0.owned.epoch(shard)
    }

    fn generation(&self) -> u64 {
        self.0.owned.generation()
    }

    fn home(&self) -> Option<u32> {
        let turn = self.0.next_home.fetch_add(1, Ordering::Relaxed);
        self.0.owned.nth(turn)
    }

    fn send(&self, shard: u32, command: Bytes) -> Pin<Box<dyn Future<Output = Result<Sent, KernelError>> + Send>> {
        let links = self.clone();
        Box::pin(async move { links.send_to_owner(shard, command).await })
    }
}

/// The link service another replica dials.
pub struct LinkApi(pub Links);

#[tonic::async_trait]
impl LinkService for LinkApi {
    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardResponse>, Status> {
        if !self.0.admits(&request) {
            warn!("a link request without the cluster's key was refused");
            return Err(Status::unauthenticated("not a replica of this cluster"));
        }
        let ForwardRequest { command, from_replica } = request.into_inner();
        let command = Forwarded::decode(&command).map_err(Status::from)?;
        if let Some(shard) = command.shard()
            && !self.0.owns_sent(shard).await
        {
            return Err(Status::aborted(format!("shard {shard} is not this replica's")));
        }
        crate::metrics::get().applied_for_others.inc();
        debug!(from = from_replica, "applying a write for another replica");
        let reply = self.0.0.store.apply_forwarded(command).await;
        Ok(Response::new(ForwardResponse { reply }))
    }
}
