//! Server-sent event streams: a held lease's life (`queued`, `granted`, `heartbeat`, then
//! `lost` or `failed`) as the contract names its events.
//!
//! The stream is pulled by the connection: hyper asks for the next event only when it can
//! write it, so a client that does not read fills the held lease's small buffer and no
//! more (see `lease::hold`). Compression skips `text/event-stream`, and the request
//! timeout covers only the time to the response's head, so streams outlive both.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::types::LeaseBody;
use crate::lease::HoldEvent;
use crate::wire::{LostEvent, QueuedEvent};

/// A comment line this often keeps proxies from closing a quiet stream (heartbeats come
/// only every third of the TTL, which may be many minutes).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whether the client asked for a stream (`Accept: text/event-stream`).
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| {
            media
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

fn event<T: Serialize>(name: &'static str, data: &T) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name))
}

fn hold_event(e: HoldEvent) -> Event {
    match e {
        HoldEvent::Queued { position } => event(
            "queued",
            &QueuedEvent {
                position: position as u64,
            },
        ),
        HoldEvent::Granted(lease) => event("granted", &LeaseBody::new(&lease, false)),
        HoldEvent::Renewed(lease) => event("heartbeat", &LeaseBody::new(&lease, false)),
        HoldEvent::Lost(reason) => event(
            "lost",
            &LostEvent {
                reason: reason.code().to_owned(),
                message: reason.message().to_owned(),
            },
        ),
        HoldEvent::Failed(e) => event("failed", &ApiError::from(e).body()),
    }
}

/// The SSE response for a held lease's events.
pub fn hold(
    rx: mpsc::Receiver<HoldEvent>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((Ok(hold_event(next)), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_event_stream_accept_asks_for_a_stream() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, v.parse().unwrap());
            wants_stream(&h)
        };
        assert!(with("text/event-stream"));
        assert!(with("application/json, Text/Event-Stream;q=0.9"));
        assert!(!with("application/json"));
        assert!(!with("*/*"));
        assert!(!wants_stream(&HeaderMap::new()));
    }
}
