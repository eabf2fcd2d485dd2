//! The HTTP server loop: bounded connections, timeouts on what a client sends, and a
//! shutdown with a deadline.
//!
//! `axum::serve` gives no header-read or idle timeout (hyper's needs a timer it does not
//! set), no connection limit, and a graceful shutdown that waits for every connection however
//! long a client takes to finish its request. A scheduler node is shared infrastructure: one
//! client that sends half a request, or opens connections and stays silent, must not keep
//! the node from answering others, nor from stopping when its orchestrator asks.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

/// What the server allows a client.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Longest wait for a request's head (its line and headers), from the connection's start
    /// or the end of the previous answer: it also closes a keep-alive connection idle that
    /// long (HTTP/1.1). Default 10 s.
    pub header_read_timeout: Duration,
    /// Longest wait for a request's whole body once its head is read (answered 408).
    /// Default 30 s.
    pub body_read_timeout: Duration,
    /// Most connections open at once; more wait in the listen backlog until one closes.
    /// Default [`HttpLimits::default_max_connections`].
    pub max_connections: usize,
    /// On shutdown, how long in-flight requests may take to finish before their connections
    /// are closed. Default 30 s.
    pub shutdown_timeout: Duration,
    /// Longest a client may leave an answer unread (the connection accepts none of its
    /// bytes); the connection is then closed and the answer's memory freed. Default 30 s.
    pub send_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: HttpLimits::default_max_connections(),
            shutdown_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// File descriptors kept free of connections: the database (a pool of connections, or
/// SQLite's file, WAL and shared memory with a reader pool), NATS, logs.
const RESERVED_FDS: u64 = 64;

impl HttpLimits {
    /// 1,024 connections, or fewer when the process's open-files limit would not leave
    /// [`RESERVED_FDS`] descriptors for the database and the rest: at the limit, `accept`
    /// fails and every new connection, `/healthz` included, would wait for a descriptor.
    pub fn default_max_connections() -> usize {
        let limit = open_files_limit().map_or(1024, |n| n.saturating_sub(RESERVED_FDS));
        limit.clamp(1, 1024) as usize
    }
}

/// The soft open-files limit, from `/proc/self/limits` (Linux; `None` elsewhere or when it
/// cannot be read, or it is unlimited).
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files_limit(&text)
}

fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The body-read deadline of a request, put in its extensions for [`crate::body`]'s
/// extractors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyReadTimeout(pub(crate) Duration);

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting, lets the
/// requests in flight finish for up to [`HttpLimits::shutdown_timeout`], and closes the
/// connections left. Returns once every connection is closed.
///
/// # Errors
///
/// None today: accept errors (a full descriptor table, a connection reset before it was
/// accepted) are logged and retried, never fatal.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = app.layer(axum::Extension(BodyReadTimeout(limits.body_read_timeout)));
    // HTTP/1.1, as `axum::serve` without axum's `http2` feature.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let mut said_full: Option<Instant> = None;
    let mut said_accept: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        if slots.available_permits() == 0 && said(&mut said_full) {
            tracing::warn!(
                max_connections = limits.max_connections,
                "connection limit reached: new connections wait in the listen backlog until one \
                 closes (--max-connections)"
            );
        }
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed
            },
            () = &mut shutdown => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    if said(&mut said_accept) {
                        tracing::warn!(error = %e, open = limits.max_connections.saturating_sub(slots.available_permits() + 1),
                            "cannot accept a connection; retrying (a full descriptor table: lower \
                             --max-connections or raise the open-files limit)");
                    }
                    // A full descriptor table stays full for a while: do not spin on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (builder, watcher, app) = (Arc::clone(&builder), graceful.watcher(), app.clone());
        connections.spawn(async move {
            let io = TokioIo::new(WriteStall::new(stream, limits.send_timeout));
            let conn = builder.serve_connection(io, TowerToHyperService::new(app));
            let _ = watcher.watch(conn).await;
            drop(slot);
        });
    }
    drop(listener);
    let open = graceful.count();
    if open > 0 {
        tracing::info!(
            connections = open,
            deadline_s = limits.shutdown_timeout.as_secs_f64(),
            "waiting for requests in flight"
        );
    }
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "shutdown deadline passed: closing the connections still open"
        );
        connections.abort_all();
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// A connection whose writes fail once the peer has accepted nothing for `limit`: a client
/// that stops reading its answer would otherwise hold the answer (and the connection) for as
/// long as it likes. Reads are not timed here (hyper times the request's head; the body
/// extractors its body).
struct WriteStall<T> {
    io: T,
    limit: Duration,
    /// Since when writes have been refused, as the deadline of the stall.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    fn new(io: T, limit: Duration) -> WriteStall<T> {
        WriteStall {
            io,
            limit,
            stalled: None,
        }
    }

    /// After a write that did not progress: pending until the stall's deadline, then an error.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer for the send timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<R>(
        &mut self,
        r: Poll<io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progressed(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progressed(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.progressed(r, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Whether to log a repeated condition now: at most once every 10 s.
fn said(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(10)) {
        return false;
    }
    *last = Some(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soft_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95524                95524                processes \n\
                      Max open files            256                  524288               files     \n";
        assert_eq!(parse_open_files_limit(limits), Some(256));
        assert_eq!(
            parse_open_files_limit("Max open files   unlimited  unlimited files"),
            None
        );
        assert_eq!(parse_open_files_limit(""), None);
    }
}
