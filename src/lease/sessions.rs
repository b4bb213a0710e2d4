//! Sessions: one heartbeat for many holds. A session is opened with a TTL, renewed (or held
//! by a stream, which renews it), and ended; any grant may name it, and is then held for as
//! long as the session is: one renew of the session, one call per master, renews every
//! hold made through it, and ending it releases them all at once and wakes their waiters
//! on every replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::events::LockEvent;
use super::hold::next_renew;
use super::{Lease, LeaseError, LeaseService, Ttl};
use crate::metrics::StreamKind;
use crate::model::{FencingToken, Kind, LeaseId, LockKey, Owner, SessionId, stream_name};
use crate::model::{Jeopardy, SessionHold};
use crate::redlock::{EngineError, SessionLease};

/// Events a held stream of a session's life buffers: `opened`, then `heartbeat`s, then
/// perhaps `lost`.
const SESSION_BUFFER: usize = 8;

/// A session as the service hands it to the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    pub id: SessionId,
    pub ttl: Duration,
    pub validity: Duration,
    pub remaining: Duration,
    pub owner: Option<Owner>,
    pub at: Instant,
    /// What is held through it (read only).
    pub holds: Vec<HeldThrough>,
    /// Renew only: the holds it kept, valid as long as the session now. A hold through the
    /// session that is not listed here was not extended.
    pub kept: Option<Vec<LeaseId>>,
    /// Renew only: holds it could neither confirm nor deny (a master that carries one did not
    /// answer): still held, their validity not extended.
    pub unconfirmed: Vec<LeaseId>,
    /// Renew only: holds a majority of masters deny carrying (revoked, force-released,
    /// expired, or granted on only some of them): they ended, and were released.
    pub lost: Vec<LeaseId>,
    /// Renew only: the held stream a majority of masters say keeps the session (`""`: the
    /// one that opened it, or none).
    pub kept_by: Option<Arc<str>>,
}

impl Session {
    fn new(id: SessionId, lease: SessionLease) -> Self {
        Self {
            id,
            ttl: lease.ttl,
            validity: lease.validity,
            remaining: lease.remaining,
            owner: lease.owner,
            at: lease.at,
            holds: Vec::new(),
            kept: None,
            unconfirmed: lease.unconfirmed,
            lost: lease.lost,
            kept_by: lease.kept_by,
        }
    }

    /// How long the client may still rely on the session, now.
    pub(crate) fn validity_now(&self) -> Duration {
        self.validity.saturating_sub(self.at.elapsed())
    }
}

/// One hold made through a session, as `GET /sessions/{id}` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldThrough {
    /// The kind's collection: locks, semaphores, elections.
    pub kind: Kind,
    pub name: String,
    /// A several-name lease's names; a permit's slot; a shared lease's mode.
    pub names: Vec<String>,
    pub slot: Option<u16>,
    pub shared: bool,
    pub lease: LeaseId,
    pub token: FencingToken,
}

impl HeldThrough {
    fn of(hold: &SessionHold) -> Option<Self> {
        let key = &hold.key;
        let lease = hold.lease.clone();
        let token = hold.token;
        let view = |kind, name: &str| Self {
            kind,
            name: name.to_owned(),
            names: Vec::new(),
            slot: None,
            shared: false,
            lease: lease.clone(),
            token,
        };
        Some(match key.kind {
            Kind::Mutex => view(Kind::Mutex, &key.name),
            Kind::Election => view(Kind::Election, &key.name),
            Kind::Reader => Self {
                shared: true,
                ..view(Kind::Mutex, key.owner_name())
            },
            Kind::Semaphore => {
                let (name, slot) = key.name.rsplit_once('/')?;
                Self {
                    slot: slot.parse().ok(),
                    ..view(Kind::Semaphore, name)
                }
            }
            Kind::Group => {
                let names: Vec<String> = key.members().iter().map(|m| m.name.to_string()).collect();
                Self {
                    names: names.clone(),
                    ..view(Kind::Mutex, names.first()?)
                }
            }
        })
    }
}

/// Sessions this process opened (or renewed), with when each lapses unless renewed: the
/// source of `redlockd_sessions_active`.
#[derive(Default)]
pub(super) struct Sessions(Mutex<HashMap<SessionId, Instant>>);

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Instant>> {
        // A plain map of deadlines: nothing a panic elsewhere could leave half-done.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, session: &Session) {
        let mut map = self.map();
        let now = Instant::now();
        if map.len() >= 1024 && map.len().is_power_of_two() {
            map.retain(|_, lapses| *lapses > now);
        }
        map.insert(session.id.clone(), now + session.remaining);
    }

    fn forget(&self, id: &SessionId) {
        self.map().remove(id);
    }

    pub(super) fn active(&self) -> usize {
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, lapses| *lapses > now);
        map.len()
    }
}

/// Why a streamed session ended, as its `lost` event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionLost {
    /// A renew found the session gone from a majority of masters: it expired or was ended.
    NotFound,
    /// No renew reached a majority before the session's validity ran out.
    QuorumLost,
    /// The replica is shutting down: told as `closed`, and the session is left to lapse.
    ShuttingDown,
    /// Another stream resumed the session (a majority of masters say it keeps it now):
    /// told as `closed`, and the session is left to that stream.
    Resumed,
}

impl SessionLost {
    pub(crate) fn code(self) -> &'static str {
        match self {
            SessionLost::NotFound => "session_not_found",
            SessionLost::QuorumLost => "quorum_lost",
            SessionLost::ShuttingDown => "shutting_down",
            SessionLost::Resumed => "resumed",
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            SessionLost::NotFound => {
                "a renew found the session gone from a majority of masters: it expired or was ended"
            }
            SessionLost::QuorumLost => {
                "no renew reached a majority of masters before the session's validity ran out"
            }
            SessionLost::ShuttingDown => {
                "the replica holding the stream is shutting down; the session was not ended"
            }
            SessionLost::Resumed => {
                "the session was resumed through another stream; this one ends and ends nothing"
            }
        }
    }
}

/// What a streamed session tells its client.
#[derive(Debug)]
pub(crate) enum SessionEvent {
    Opened(Session),
    /// A resume took the session over (after a renew made at once).
    Resumed(Session),
    Heartbeat(Session),
    /// Renews have not got through and less than a third of the TTL is left (told once).
    Jeopardy {
        validity: Duration,
    },
    /// A renew got through after `Jeopardy` (its `Heartbeat` follows).
    Safe {
        validity: Duration,
    },
    Lost(SessionLost),
    /// This replica is shutting down: the stream ends and the session is not ended. It (and
    /// every hold through it) may be relied on for `validity` more, and lapses at its TTL
    /// unless renewed through another replica.
    Closed {
        validity: Duration,
    },
    /// Another stream resumed the session: this one ends, and ends nothing.
    Displaced,
    Failed(LeaseError),
}

fn not_found(e: EngineError) -> LeaseError {
    match e {
        EngineError::NotFound => LeaseError::SessionNotFound,
        e => e.into(),
    }
}

impl LeaseService {
    /// Open a session that lives `ttl` unless renewed, for the token named `scope` ("" without
    /// authentication): only that token's requests find it.
    pub(crate) async fn open_session(
        &self,
        ttl: Ttl,
        owner: Option<Owner>,
        scope: &str,
    ) -> Result<Session, LeaseError> {
        let id = SessionId::generate(scope);
        let lease = self
            .engine()
            .open_session(&id.key(), ttl.get(), owner)
            .await?;
        let session = Session::new(id, lease);
        self.sessions.track(&session);
        Ok(session)
    }

    /// Renew session `id`, and every hold made through it, for `ttl` (its own when `None`).
    pub(crate) async fn renew_session(
        &self,
        id: &SessionId,
        ttl: Option<Ttl>,
    ) -> Result<Session, LeaseError> {
        self.renew_session_with(id, ttl, None).await
    }

    /// `renew_session`, and with `stream` (a resume), the session kept by that held stream
    /// from now on.
    async fn renew_session_with(
        &self,
        id: &SessionId,
        ttl: Option<Ttl>,
        stream: Option<Arc<str>>,
    ) -> Result<Session, LeaseError> {
        let lease = self
            .engine()
            .renew_session(&id.key(), ttl.map(Ttl::get), stream)
            .await
            .map_err(not_found)?;
        self.metrics.session_holds(lease.holds);
        // Holds it could not keep were released: this replica's waiters for them wake now
        // (other replicas hear of it from the masters).
        self.released(&lease.released);
        let kept = lease.kept.clone();
        let mut session = Session::new(id.clone(), lease);
        session.kept = Some(kept);
        self.sessions.track(&session);
        Ok(session)
    }

    /// Session `id` and what is held through it.
    pub(crate) async fn session(&self, id: &SessionId) -> Result<Session, LeaseError> {
        let (lease, holds) = self
            .engine()
            .read_session(&id.key())
            .await
            .map_err(not_found)?;
        let mut session = Session::new(id.clone(), lease);
        session.holds = holds.iter().filter_map(HeldThrough::of).collect();
        Ok(session)
    }

    /// End session `id`: every hold made through it is released, and waiting grants on
    /// every replica are woken.
    pub(crate) async fn end_session(&self, id: &SessionId) -> Result<(), LeaseError> {
        self.end_session_as(id, None).await
    }

    /// End session `id` as `end_session` does; with `stream` (a held stream's end), only
    /// while that stream keeps it (`SessionNotFound` once another resumed it).
    async fn end_session_as(
        &self,
        id: &SessionId,
        stream: Option<Arc<str>>,
    ) -> Result<(), LeaseError> {
        let holds = self
            .engine()
            .end_session(&id.key(), stream)
            .await
            .map_err(not_found)?;
        self.sessions.forget(id);
        self.released(&holds);
        Ok(())
    }

    /// `holds`, released through their session: no longer this replica's leases, and their
    /// waiters here are told at once.
    fn released(&self, holds: &[SessionHold]) {
        for hold in holds {
            self.forget(&hold.lease);
            for member in hold.key.members() {
                self.events()
                    .publish(&member.topic(), LockEvent::Released { token: hold.token });
            }
        }
    }

    /// Make the just granted `lease` (on `key`) one of session `id`'s holds: its validity
    /// is then the session's. When the session is gone, the hold is released and the grant
    /// answers `SessionNotFound`.
    pub(super) async fn attach_to(
        &self,
        id: &SessionId,
        mut lease: Lease,
        key: LockKey,
    ) -> Result<Lease, LeaseError> {
        let hold = SessionHold {
            key: key.clone(),
            lease: lease.id.clone(),
            token: lease.token,
        };
        match self.engine().attach(&id.key(), hold).await {
            Ok(session) => {
                lease.ttl = session.ttl;
                lease.validity = session.validity;
                lease.remaining = session.remaining;
                lease.at = session.at;
                lease.session = Some(id.clone());
                Ok(lease)
            }
            Err(e) => {
                let _ = self.engine().release(&key, &lease.id).await;
                for member in key.members() {
                    self.events().wake(&member.topic());
                }
                Err(not_found(e))
            }
        }
    }

    /// Open a session held by a stream: renewed at a third of its TTL while the stream is
    /// open, ended when the client leaves (every hold through it released), or `grace`
    /// after, for a resume.
    pub(crate) fn hold_session(
        self: &Arc<Self>,
        ttl: Ttl,
        owner: Option<Owner>,
        scope: Arc<str>,
        grace: Duration,
    ) -> Result<mpsc::Receiver<SessionEvent>, LeaseError> {
        self.stream(SESSION_BUFFER, |service, tx| {
            service.session_task(ttl, owner, scope, grace, tx)
        })
    }

    /// Take over session `id`, held before (through a stream on any replica, or not), and
    /// hold it as `hold_session` does: a resume. It is renewed at once, and from then on
    /// only this stream's end ends it.
    pub(crate) fn resume_session(
        self: &Arc<Self>,
        id: SessionId,
        grace: Duration,
    ) -> Result<mpsc::Receiver<SessionEvent>, LeaseError> {
        self.stream(SESSION_BUFFER, |service, tx| {
            service.resume_session_task(id, grace, tx)
        })
    }

    async fn session_task(
        self: Arc<Self>,
        ttl: Ttl,
        owner: Option<Owner>,
        scope: Arc<str>,
        grace: Duration,
        tx: mpsc::Sender<SessionEvent>,
    ) {
        let _open = self.metrics.stream_opened(StreamKind::Session);
        let session = tokio::select! {
            result = self.open_session(ttl, owner, &scope) => result,
            () = tx.closed() => return,
        };
        let session = match session {
            Ok(session) => session,
            Err(e) => {
                let _ = tx.send(SessionEvent::Failed(e)).await;
                return;
            }
        };
        // The stream that opened the session keeps it under the empty name (session.lua).
        let _ = tx.send(SessionEvent::Opened(session.clone())).await;
        self.carry_session(session, Arc::from(""), grace, &tx).await;
    }

    async fn resume_session_task(
        self: Arc<Self>,
        id: SessionId,
        grace: Duration,
        tx: mpsc::Sender<SessionEvent>,
    ) {
        let _open = self.metrics.stream_opened(StreamKind::Session);
        // A session is its token's alone (its id is scoped to it): no opener to check.
        let stream = stream_name("");
        let session = match self
            .renew_session_with(&id, None, Some(stream.clone()))
            .await
        {
            Ok(session) => session,
            Err(e) => {
                let _ = tx.send(SessionEvent::Failed(e)).await;
                return;
            }
        };
        let _ = tx.send(SessionEvent::Resumed(session.clone())).await;
        self.carry_session(session, stream, grace, &tx).await;
    }

    /// Keep `session` renewed through the held stream named `stream` until it is lost, its
    /// client leaves (and `grace` is up), another stream resumes it, or this replica stops;
    /// then end it as the reason says.
    async fn carry_session(
        &self,
        session: Session,
        stream: Arc<str>,
        grace: Duration,
        tx: &mpsc::Sender<SessionEvent>,
    ) {
        let id = session.id.clone();
        let ttl = session.ttl;
        let every = ttl / 3;
        let retry = (every / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let mut valid_until = session.at + session.validity;
        let mut next = next_renew(every);
        let mut jeopardy = Jeopardy::new(ttl);
        let warn = |validity| {
            let _ = tx.try_send(SessionEvent::Jeopardy { validity });
        };
        let lost = loop {
            let warn_at = jeopardy.at(valid_until);
            tokio::select! {
                () = sleep_until(next.min(valid_until)) => {
                    if Instant::now() >= valid_until {
                        break Some(SessionLost::QuorumLost);
                    }
                    let renew = timeout_at(valid_until, self.renew_session(&id, None));
                    match jeopardy.during(renew, valid_until, warn).await {
                        Err(_) => break Some(SessionLost::QuorumLost),
                        Ok(Ok(renewed)) if displaced(&renewed, &stream) => {
                            break Some(SessionLost::Resumed);
                        }
                        Ok(Ok(renewed)) => {
                            valid_until = renewed.at + renewed.validity;
                            next = next_renew(every);
                            if let Some(validity) = jeopardy.renewed(valid_until) {
                                let _ = tx.try_send(SessionEvent::Safe { validity });
                            }
                            let _ = tx.try_send(SessionEvent::Heartbeat(renewed));
                        }
                        Ok(Err(LeaseError::SessionNotFound)) => break Some(SessionLost::NotFound),
                        Ok(Err(_)) => next = Instant::now() + retry,
                    }
                }
                () = sleep_until(warn_at.unwrap_or(valid_until)), if warn_at.is_some() => {
                    warn(jeopardy.warn(valid_until));
                }
                () = tx.closed() => break None,
                () = self.shutdown.cancelled() => break Some(SessionLost::ShuttingDown),
            }
        };
        let told = match lost {
            // A validity answered is kept: the session is not ended under its holds; it
            // lapses at its TTL, or its holder resumes it through another replica.
            Some(SessionLost::ShuttingDown) => SessionEvent::Closed {
                validity: valid_until.saturating_duration_since(Instant::now()),
            },
            Some(SessionLost::Resumed) => SessionEvent::Displaced,
            Some(reason) => SessionEvent::Lost(reason),
            None => {
                // The client left: with a grace, its holder may resume the session through
                // any replica until the grace (or the validity) is up; renewed no further.
                if !grace.is_zero() {
                    let until = valid_until.min(Instant::now() + grace);
                    tokio::select! {
                        () = sleep_until(until) => {}
                        () = self.shutdown.cancelled() => return,
                    }
                }
                let _ = self.end_session_as(&id, Some(stream)).await;
                return;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(told)).await;
        match lost {
            Some(SessionLost::QuorumLost) => {
                let _ = self.end_session_as(&id, Some(stream)).await;
            }
            Some(SessionLost::ShuttingDown) => {
                self.keep_session_through_drain(&id, every, &stream).await;
            }
            _ => {}
        }
    }

    /// After `closed`: renew session `id` every `every` until this replica's drain
    /// deadline, so that a holder that resumes it through another replica finds it (and its
    /// holds) kept however long its reconnect took. Stops once another stream keeps it or it
    /// is gone; never ends it.
    async fn keep_session_through_drain(&self, id: &SessionId, every: Duration, stream: &str) {
        self.renew_through_drain(every, || async {
            let renewed = self.renew_session(id, None).await?;
            Ok(displaced(&renewed, stream))
        })
        .await;
    }
}

/// Whether a renew of a session found that another held stream keeps it (a majority of
/// masters name one other than `stream`).
fn displaced(renewed: &Session, stream: &str) -> bool {
    renewed.kept_by.as_deref().is_some_and(|k| k != stream)
}
