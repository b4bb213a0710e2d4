//! Serving connections: hyper-util's server with the limits `axum::serve` lacks. A client
//! must send its headers within the client timeout, and at most the configured number of
//! connections are open at once (the rest wait in the listen backlog), so that slow or
//! idle clients cannot exhaust the process. On shutdown the listener closes and open
//! connections finish the requests they have in flight. With TLS configured, each
//! connection's handshake is done (bounded by the same client timeout) before HTTP starts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The limits one listener enforces.
#[derive(Clone)]
pub(crate) struct Limits {
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// HTTPS, when configured: each connection's handshake must end within the header
    /// timeout.
    pub tls: Option<Arc<super::tls::Tls>>,
}

/// Serve `router` on `listener` until `signal` completes, then stop accepting and wait for
/// the open connections to finish their requests in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    signal: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(signal);
    loop {
        let permit = tokio::select! {
            () = &mut signal => break,
            // The semaphore is never closed.
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most often: wait for connections to close.
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let Some(tls) = limits.tls.clone() else {
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(permit);
            });
            continue;
        };
        // The handshake runs in the connection's task, so that a slow one holds up no
        // other; it is bounded like the headers that follow it.
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(header_timeout, tls.acceptor.accept(stream));
            let stream = match handshake.await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
