//! A TCP proxy that holds every byte back for a fixed time each way, as a network between
//! machines does: the replicas benchmark puts one between each replica and PostgreSQL, so that
//! replicas on one machine are bound by round trips as they are across machines, and not only by
//! this machine's cores. Chunks keep their order and nothing limits how many are in flight, so
//! pipelined statements stay pipelined. Tokio's timer ticks in milliseconds: a delay of 1 ms
//! holds a chunk back 1 to 2 ms.
//!
//!   delay-proxy --upstream 127.0.0.1:5432 --delay-ms 1 [--listen 127.0.0.1:0]
//!
//! Prints the address it listens on, then serves until killed.

use std::time::Duration;

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "A TCP proxy that delays each direction by a fixed time")]
struct Args {
    /// Where connections go: HOST:PORT.
    #[arg(long)]
    upstream: String,
    /// Milliseconds each chunk is held back, each way.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Where to listen; port 0 picks a free one (printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(&args.listen).await?;
    println!("{}", listener.local_addr()?);
    let delay = Duration::from_millis(args.delay_ms);
    loop {
        let (client, _) = listener.accept().await?;
        let upstream = args.upstream.clone();
        tokio::spawn(async move {
            let server = match TcpStream::connect(&upstream).await {
                Ok(server) => server,
                Err(error) => {
                    eprintln!("delay-proxy: cannot reach {upstream}: {error}");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (from_client, to_client) = client.into_split();
            let (from_server, to_server) = server.into_split();
            tokio::join!(pipe(from_client, to_server, delay), pipe(from_server, to_client, delay));
        });
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, in order.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (chunks, mut held) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buffer).await {
            if n == 0 || chunks.send((Instant::now() + delay, buffer[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = held.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
