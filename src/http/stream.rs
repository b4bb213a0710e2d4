//! Server-sent event streams: a held lease's life (`queued`, `granted` or `elected`, or
//! `resumed`,
//! `heartbeat`, `jeopardy` and `safe`, then `lost` or `failed`), and an election's changes of leader (`elected`,
//! `proclaimed`, `vacant`), as the contract names their events.
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
use crate::lease::{HoldEvent, LeaderChange, Lease, LostReason};
use crate::model::Kind;
use crate::wire::{ElectionLease, LeaderEvent, LeaseBody, PermitBody};
use crate::wire::{JeopardyEvent, LostEvent, QueuedEvent};

/// A comment line this often keeps proxies from closing a quiet stream (heartbeats come
/// only every third of the TTL, which may be many minutes).
pub(super) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whether the client asked for a stream (`Accept: text/event-stream`).
pub(crate) fn wants_stream(headers: &HeaderMap) -> bool {
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

/// What `closed` tells the holder of a stream whose replica stops.
pub(super) const CLOSED_MESSAGE: &str = "this replica is shutting down; the hold was not revoked: rely on it for validity_ms, and resume it (POST its lease's /hold) through another replica to keep it";

/// What `jeopardy` and `safe` tell the holder.
const JEOPARDY_MESSAGE: &str = "renews are not getting through; less than a third of the TTL is left: stop what the lease guards unless `safe` comes before validity_ms is up";
const SAFE_MESSAGE: &str = "a renew got through: the lease is held again";

fn event<T: Serialize>(name: &'static str, data: &T) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name))
}

/// One event of a held stream, in its kind's words: an election's grant is told as
/// `elected`, with the leader's lease body.
fn hold_event(kind: Kind, e: HoldEvent) -> Event {
    let election = kind == Kind::Election;
    let lease = |name, lease: &Lease| match kind {
        Kind::Election => event(name, &ElectionLease::new(lease)),
        Kind::Semaphore => event(name, &PermitBody::from(lease)),
        _ => event(name, &LeaseBody::new(lease, false)),
    };
    match e {
        HoldEvent::Queued { position } => event(
            "queued",
            &QueuedEvent {
                position: position as u64,
            },
        ),
        HoldEvent::Granted(l) if election => lease("elected", &l),
        HoldEvent::Granted(l) => lease("granted", &l),
        HoldEvent::Resumed(l) => lease("resumed", &l),
        HoldEvent::Renewed(l) => lease("heartbeat", &l),
        HoldEvent::Jeopardy { validity } => jeopardy(validity),
        HoldEvent::Safe { validity } => safe(validity),
        HoldEvent::Lost(reason) => ended("lost", reason.code(), reason.message()),
        HoldEvent::Closed { validity } => closed(CLOSED_MESSAGE, validity),
        HoldEvent::Displaced => ended(
            "closed",
            LostReason::Resumed.code(),
            LostReason::Resumed.message(),
        ),
        HoldEvent::Failed(e) => {
            let e = ApiError::from(*e);
            let e = match kind {
                Kind::Election => e.in_election(),
                Kind::Semaphore => e.in_semaphore(),
                _ => e,
            };
            event("failed", &e.body())
        }
    }
}

/// `jeopardy`: renews are not getting through, and `validity` is left.
pub(super) fn jeopardy(validity: Duration) -> Event {
    warning("jeopardy", JEOPARDY_MESSAGE, validity)
}

/// `safe`: a renew got through after `jeopardy`, and `validity` is left.
pub(super) fn safe(validity: Duration) -> Event {
    warning("safe", SAFE_MESSAGE, validity)
}

fn warning(name: &'static str, message: &str, validity: Duration) -> Event {
    let body = JeopardyEvent {
        validity_ms: crate::model::millis(validity),
        message: message.to_owned(),
    };
    event(name, &body)
}

/// `name` (`lost`, or `closed` without a resume) that ends a stream, for `reason`.
pub(super) fn ended(name: &'static str, reason: &str, message: &str) -> Event {
    let body = LostEvent {
        reason: reason.to_owned(),
        message: message.to_owned(),
        validity_ms: None,
        resume: None,
    };
    event(name, &body)
}

/// `closed` as this replica stops: the hold is not ended, `validity` is left, and its
/// holder may resume it through another replica.
pub(super) fn closed(message: &str, validity: Duration) -> Event {
    let body = LostEvent {
        reason: "shutting_down".to_owned(),
        message: message.to_owned(),
        validity_ms: Some(crate::model::millis(validity)),
        resume: Some(true),
    };
    event("closed", &body)
}

/// The SSE response for a held lease's events.
pub(crate) fn hold(
    kind: Kind,
    rx: mpsc::Receiver<HoldEvent>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let events = futures::stream::unfold(rx, move |mut rx| async move {
        let next = rx.recv().await?;
        Some((Ok(hold_event(kind, next)), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

fn leader_event(name: &str, change: LeaderChange) -> Event {
    let (kind, term, value) = match change {
        LeaderChange::ShuttingDown => {
            return ended(
                "closed",
                "shutting_down",
                "this replica is shutting down; reconnect to another replica",
            );
        }
        LeaderChange::Elected { term, value } => ("elected", Some(term), value),
        LeaderChange::Proclaimed { term, value } => ("proclaimed", Some(term), value),
        LeaderChange::Vacant { last_term } => ("vacant", last_term, None),
    };
    event(
        kind,
        &LeaderEvent {
            name: name.to_owned(),
            term,
            value,
        },
    )
}

/// The SSE response of an election's observers.
pub(crate) fn observe(
    name: String,
    rx: mpsc::Receiver<LeaderChange>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let events = futures::stream::unfold(rx, move |mut rx| {
        let name = name.clone();
        async move {
            let next = rx.recv().await?;
            Some((Ok(leader_event(&name, next)), rx))
        }
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
