//! Rounds of a worker that holds a name through a held stream (`POST /locks/{name}/hold`,
//! or a session's held stream that the name is granted through): the server renews the
//! lease while the connection lives, and the worker ends its hold by closing the
//! connection, the holder's revoke.
//!
//! A held stream's events are recorded as the steps they stand for, in the checker's terms:
//! `granted` as a grant, each `heartbeat` as a renew, and the close as a revoke at the
//! moment the worker let go (its outcome unknown: the server revokes when it sees the
//! connection closed, which the client does not learn). Where each promise ends is read
//! from the event's `expires_at` (the replicas run on this machine, on this clock): a
//! renew the server started is not seen by the client, so a validity counted from the
//! event's arrival would claim more than was promised, and one counted from the grant's
//! request far less. A stream that ends without a word from the server (its replica
//! killed) or with `closed` (its replica stopping) or `lost` leaves the last promise
//! standing, which is what its holder may still rely on. One exception, for the rolling deploy: the previous release
//! revoked a held stream's lease when its replica stopped and told the holder with `lost`
//! (`shutting_down`, which this release never sends), so that holder relies on nothing
//! from the moment it is told.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

use super::checker::{Event, Kind};
use super::common::EventStream;
use super::{Bases, Recorder, back_off, live_replicas, pick_live, session_renew_status};

/// How long a grant of a held stream may take to be answered before the worker gives up on
/// it (and closes it, which revokes whatever it may have won).
const ANSWER_WITHIN: Duration = Duration::from_secs(4);

/// The HTTP client of held streams: no overall timeout (a stream lasts as long as its
/// hold), a bounded connect.
fn stream_client() -> reqwest::Client {
    super::common::http_builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The replicas' clock-drift factor (`REDLOCKD_DRIFT_FACTOR`, left at its default).
const DRIFT_FACTOR: f64 = 0.01;

/// Where the validity of a lease body ends on the run's timeline. The body's `expires_at`
/// (RFC 3339, truncated to the millisecond) is when its keys lapse; its validity ends the
/// drift allowance before that (`ttl_ms` × the drift factor + 2 ms; a renew's allowance is
/// of what the masters keep, at most that).
fn on_timeline(recorder: &Recorder, value: &Value) -> Option<Duration> {
    let lapses = humantime::parse_rfc3339(value["expires_at"].as_str()?).ok()?;
    let ttl = Duration::from_millis(value["ttl_ms"].as_u64()?);
    let ends = lapses - (ttl.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2));
    ends.duration_since(recorder.started_wall).ok()
}

/// The status a `failed` event's error body stands for, as a grant answered it.
fn failed_status(error: &Value) -> u16 {
    match error["error"].as_str() {
        Some("lock_held" | "lock_delay") => 409,
        Some("quorum_unavailable" | "shutting_down") => 503,
        Some("session_not_found") => 404,
        Some("too_many_requests") => 429,
        _ => 500,
    }
}

/// The names held through streams: plain locks that the other workers take too (and
/// `job:c` with `job:a` in one lease on both). `job:d` is drawn one time in three, so that
/// the workers' lock-delayed grants of it still have turns enough to be judged.
const STREAMED: [&str; 3] = ["job:c", "job:c", "job:d"];

/// A worker that holds names only through held streams, one after another, until `stop`.
pub(super) async fn stream_worker(
    seed: u64,
    bases: Bases,
    recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = stream_client();
    while !stop.load(Ordering::Acquire) {
        let name = STREAMED[rng.random_range(0..STREAMED.len())];
        // Some of `job:c`'s turns hold it through a session's stream instead (`job:d`'s
        // lock-delayed turns are left as many as they were).
        if name == "job:c" && rng.random_bool(0.5) {
            session_stream_round(&mut rng, &http, &bases, name, &recorder).await;
        } else {
            stream_round(&mut rng, &http, &bases, name, &recorder).await;
        }
        back_off(&mut rng).await;
    }
}

/// One round: hold `name` through a stream on a live replica for a while, then close it.
async fn stream_round(
    rng: &mut StdRng,
    http: &reqwest::Client,
    bases: &Bases,
    name: &str,
    recorder: &Recorder,
) {
    let Some((replica, base)) = pick_live(bases, rng).await else {
        return;
    };
    let ttl = Duration::from_millis(rng.random_range(400..1500));
    let wait = if rng.random_bool(0.5) { 300 } else { 0 };
    let record_at = |replica, kind, status, lease: Option<&str>, invoked, answered, v: &Value| {
        recorder.record(Event {
            kind,
            replica,
            name: name.to_owned(),
            lease: lease.map(str::to_owned),
            invoked,
            answered,
            status,
            token: v["fencing_token"].as_u64(),
            validity: on_timeline(recorder, v).map(|end| end.saturating_sub(invoked)),
            ttl,
            message: v["message"].as_str().map(str::to_owned),
            limit: None,
            shared: false,
            lock_delay: None,
            wait: Duration::from_millis(wait),
        })
    };
    let record = |kind, status, lease: Option<&str>, invoked, answered, v: &Value| {
        record_at(replica, kind, status, lease, invoked, answered, v);
    };
    // Half the streams carry a grace longer than their TTL: a dropped connection then never
    // ends the validity last answered, and the holder may resume.
    let graced = rng.random_bool(0.5);
    let mut body = json!({"ttl_ms": ttl.as_millis() as u64, "wait_ms": wait});
    if graced {
        body["grace_ms"] = json!(ttl.as_millis() as u64 + 200);
    }
    let invoked = recorder.started.elapsed();
    let opened = open_stream(http, format!("{base}/locks/{name}/hold"), &body).await;
    let mut stream = match opened {
        Ok(stream) => stream,
        // Status 0, unknown: a grant may have been won before the connection broke (and is
        // revoked by the server when it sees it closed).
        Err((status, body)) => {
            let answered = recorder.started.elapsed();
            record(Kind::Grant, status, None, invoked, answered, &body);
            return;
        }
    };
    let answer_by = tokio::time::Instant::now() + ANSWER_WITHIN + Duration::from_millis(wait);
    let lease = loop {
        let event = tokio::time::timeout_at(answer_by, stream.next()).await;
        let answered = recorder.started.elapsed();
        match event {
            Ok(Some((event, _))) if event == "queued" => continue,
            Ok(Some((event, body))) if event == "granted" => {
                let Some(id) = body["lease_id"].as_str().map(str::to_owned) else {
                    return;
                };
                record(Kind::Grant, 201, Some(&id), invoked, answered, &body);
                break id;
            }
            Ok(Some((event, body))) if event == "failed" => {
                record(
                    Kind::Grant,
                    failed_status(&body),
                    None,
                    invoked,
                    answered,
                    &body,
                );
                return;
            }
            // No answer in time, or the stream ended without one: unknown, as above.
            _ => {
                record(Kind::Grant, 0, None, invoked, answered, &Value::Null);
                return;
            }
        }
    };
    // Held for up to four renews.
    let hold = ttl / 3 * rng.random_range(1..5) + Duration::from_millis(rng.random_range(0..100));
    let mut until = tokio::time::Instant::now() + hold;
    let mut open = true;
    let mut at_replica = replica;
    let mut stream = Some(stream);
    // A blip, now and then, for streams held with a grace: the connection drops without a
    // revoke and the holder resumes through another replica.
    let mut blip = graced && rng.random_ratio(2, 3);
    // From now on the holder relies on nothing: a revoke of unknown outcome.
    let let_go = |replica| {
        let at = recorder.started.elapsed();
        record_at(replica, Kind::Revoke, 0, Some(&lease), at, at, &Value::Null);
    };
    // A resume is a renew through the replica that answered it.
    let took_over = |r: &Resume| {
        record_at(
            r.replica,
            Kind::Renew,
            r.status,
            Some(&lease),
            r.invoked,
            r.answered,
            &r.body,
        );
    };
    while open {
        let Some(current) = stream.as_mut() else {
            break;
        };
        match tokio::time::timeout_at(until, current.next()).await {
            Err(_) if blip => {
                blip = false;
                // The grace outlasts the TTL, so the holder goes on relying on its last
                // validity while it resumes (and the grace's end, after the resume, must
                // revoke nothing).
                stream = None;
                recorder.blips.fetch_add(1, Ordering::Relaxed);
                match resume_elsewhere(http, bases, name, &lease, at_replica, recorder, &took_over)
                    .await
                {
                    Some((next, resumed)) => {
                        stream = Some(resumed);
                        at_replica = next;
                        until = tokio::time::Instant::now()
                            + ttl / 3
                            + Duration::from_millis(rng.random_range(0..100));
                    }
                    // A resume that fails ends the holder's reliance at once (the grace's
                    // end revokes at the validity's).
                    None => {
                        let_go(at_replica);
                        open = false;
                    }
                }
            }
            Err(_) => break,
            Ok(Some((event, body))) => match told(&event, body, recorder) {
                Told::Beat(body) => {
                    let at = recorder.started.elapsed();
                    record_at(at_replica, Kind::Renew, 200, Some(&lease), at, at, &body);
                }
                // This release stopping: the holder resumes through another replica, which
                // renews the lease at once (recorded as that renew).
                Told::Resume => {
                    match resume_elsewhere(
                        http, bases, name, &lease, at_replica, recorder, &took_over,
                    )
                    .await
                    {
                        Some((next, resumed)) => {
                            stream = Some(resumed);
                            at_replica = next;
                        }
                        None => open = false,
                    }
                }
                Told::LetGo => {
                    let_go(at_replica);
                    open = false;
                }
                Told::Over => open = false,
                Told::Nothing => {}
            },
            // The replica went (killed): the lease lapses at its TTL.
            Ok(None) => open = false,
        }
    }
    // Closing the stream is the holder's revoke: from now on it relies on nothing.
    // Recorded with an unknown outcome (status 0): the server revokes when it sees the
    // connection closed (or its grace ends), a moment the client does not learn.
    if open && stream.take().is_some() {
        let_go(at_replica);
    }
    recorder.streams.fetch_add(1, Ordering::Relaxed);
}

/// One round of a worker that holds `name` through a session held by a stream
/// (`POST /sessions` with `Accept: text/event-stream`): the grant names the session, the
/// session's heartbeats are the hold's renews (when they list it as kept), a blip drops the
/// session's connection (with a grace longer than its TTL) and resumes the session through
/// another replica (`POST /sessions/{id}/hold`), and closing the stream ends the session:
/// the holder's revoke.
async fn session_stream_round(
    rng: &mut StdRng,
    http: &reqwest::Client,
    bases: &Bases,
    name: &'static str,
    recorder: &Arc<Recorder>,
) {
    let Some((replica, base)) = pick_live(bases, rng).await else {
        return;
    };
    let ttl = Duration::from_millis(rng.random_range(400..1500));
    let graced = rng.random_bool(0.7);
    let mut body = json!({"ttl_ms": ttl.as_millis() as u64});
    if graced {
        body["grace_ms"] = json!(ttl.as_millis() as u64 + 200);
    }
    let Ok(mut stream) = open_stream(http, format!("{base}/sessions"), &body).await else {
        return;
    };
    let id = match tokio::time::timeout(ANSWER_WITHIN, stream.next()).await {
        Ok(Some((event, body))) if event == "opened" => {
            body["session_id"].as_str().map(str::to_owned)
        }
        _ => None,
    };
    let Some(id) = id else {
        return;
    };
    let Some(lease) = recorder
        .grant_through(http, replica, &base, name, &id, ttl)
        .await
    else {
        // Closing the stream ends the session, and whatever a grant of unknown outcome won.
        return;
    };
    recorder.session_streams.fetch_add(1, Ordering::Relaxed);
    let record_at = |replica, status, invoked, answered, v: &Value| {
        recorder.record(Event {
            kind: Kind::Renew,
            replica,
            name: name.to_owned(),
            lease: Some(lease.clone()),
            invoked,
            answered,
            status,
            token: None,
            validity: on_timeline(recorder, v).map(|end| end.saturating_sub(invoked)),
            ttl,
            message: v["message"].as_str().map(str::to_owned),
            limit: None,
            shared: false,
            lock_delay: None,
            wait: Duration::ZERO,
        })
    };
    // A session's renew extends the hold only when it lists it as kept; one it could not
    // confirm is a renew that failed, and any other says the hold ended (as a session
    // round's renews are read).
    let status_of = |v: &Value| session_renew_status(v, Some(&lease));
    let let_go = |replica| {
        let at = recorder.started.elapsed();
        recorder.record(Event {
            kind: Kind::Revoke,
            replica,
            name: name.to_owned(),
            lease: Some(lease.clone()),
            invoked: at,
            answered: at,
            status: 0,
            token: None,
            validity: None,
            ttl,
            message: None,
            limit: None,
            shared: false,
            lock_delay: None,
            wait: Duration::ZERO,
        });
    };
    let resume_elsewhere = async |from: usize| -> Option<(usize, EventStream)> {
        let (replica, base) = live_replicas(bases).into_iter().find(|(i, _)| *i != from)?;
        let invoked = recorder.started.elapsed();
        let url = format!("{base}/sessions/{id}/hold");
        let opened = open_stream(http, url, &json!({})).await;
        let first = match opened {
            Ok(mut stream) => match tokio::time::timeout(ANSWER_WITHIN, stream.next()).await {
                Ok(Some((event, body))) if event == "resumed" => Ok((stream, body)),
                Ok(Some((event, body))) if event == "failed" => Err((failed_status(&body), body)),
                _ => Err((0, Value::Null)),
            },
            Err(refused) => Err(refused),
        };
        let answered = recorder.started.elapsed();
        match first {
            Ok((stream, body)) => {
                let status = status_of(&body);
                record_at(replica, status, invoked, answered, &body);
                recorder.resumes.fetch_add(1, Ordering::Relaxed);
                recorder.session_resumes.fetch_add(1, Ordering::Relaxed);
                (status == 200).then_some((replica, stream))
            }
            Err((status, body)) => {
                record_at(replica, status, invoked, answered, &body);
                None
            }
        }
    };
    let hold = ttl / 3 * rng.random_range(1..5) + Duration::from_millis(rng.random_range(0..100));
    let mut until = tokio::time::Instant::now() + hold;
    let mut at_replica = replica;
    let mut stream = Some(stream);
    let mut blip = graced;
    let mut open = true;
    let mut contender = None;
    while open {
        let Some(current) = stream.as_mut() else {
            break;
        };
        match tokio::time::timeout_at(until, current.next()).await {
            Err(_) if blip => {
                blip = false;
                stream = None;
                recorder.blips.fetch_add(1, Ordering::Relaxed);
                match resume_elsewhere(at_replica).await {
                    Some((next, resumed)) => {
                        stream = Some(resumed);
                        at_replica = next;
                        // Half the time a waiter is there when the first stream's grace
                        // ends: that end must free nothing the resume now holds.
                        // Its own task: the stream's events are read (and recorded) as they
                        // come meanwhile.
                        if rng.random_bool(0.5) {
                            let (http, bases, recorder) =
                                (http.clone(), bases.clone(), recorder.clone());
                            contender = Some(tokio::spawn(async move {
                                contend(&http, &bases, name, ttl, &recorder).await;
                            }));
                        }
                        // Held past the moment the first stream's grace (or validity) ends,
                        // so that what that end does is judged against the resumed hold.
                        until = tokio::time::Instant::now()
                            + ttl
                            + Duration::from_millis(rng.random_range(100..400));
                    }
                    None => {
                        let_go(at_replica);
                        open = false;
                    }
                }
            }
            Err(_) => break,
            Ok(Some((event, body))) => match told(&event, body, recorder) {
                Told::Beat(body) => {
                    let at = recorder.started.elapsed();
                    let status = status_of(&body);
                    record_at(at_replica, status, at, at, &body);
                    if status == 404 {
                        // The hold ended: the session goes on, but holds nothing of ours.
                        let_go(at_replica);
                        open = false;
                    }
                }
                Told::Resume => match resume_elsewhere(at_replica).await {
                    Some((next, resumed)) => {
                        stream = Some(resumed);
                        at_replica = next;
                    }
                    None => open = false,
                },
                Told::LetGo => {
                    let_go(at_replica);
                    open = false;
                }
                Told::Over => open = false,
                Told::Nothing => {}
            },
            Ok(None) => open = false,
        }
    }
    if open && stream.take().is_some() {
        let_go(at_replica);
    }
    if let Some(contender) = contender {
        let _ = contender.await;
    }
    recorder.streams.fetch_add(1, Ordering::Relaxed);
}

/// What a held stream's event asks of its holder.
enum Told {
    /// A `heartbeat`: the renew it stands for (its body).
    Beat(Value),
    /// `closed` with `resume`: its replica is stopping; resume through another.
    Resume,
    /// The previous release revoked a held stream's lease when its replica stopped, and said
    /// so with `lost` (`shutting_down`): its holder relies on nothing from then.
    LetGo,
    /// The hold is over (or left to lapse): nothing to revoke.
    Over,
    Nothing,
}

/// What the event `event` with `body` asks of a held stream's holder (a `jeopardy` is
/// counted).
fn told(event: &str, body: Value, recorder: &Recorder) -> Told {
    match event {
        "heartbeat" => Told::Beat(body),
        "closed" if body["resume"] == true => Told::Resume,
        "jeopardy" => {
            recorder.jeopardies.fetch_add(1, Ordering::Relaxed);
            Told::Nothing
        }
        "lost" if body["reason"] == "shutting_down" => Told::LetGo,
        "lost" | "closed" => Told::Over,
        _ => Told::Nothing,
    }
}

/// A grant of `name` that waits past a dropped stream's grace (`ttl` and a little more),
/// through any live replica, revoked at once if won.
async fn contend(
    http: &reqwest::Client,
    bases: &Bases,
    name: &str,
    ttl: Duration,
    recorder: &Recorder,
) {
    let Some((replica, base)) = live_replicas(bases).into_iter().next() else {
        return;
    };
    let wait = ttl.as_millis() as u64 + 300;
    let (status, lease) = recorder
        .grant(
            http,
            (replica, &base),
            name,
            json!({"ttl_ms": 1000, "wait_ms": wait}),
            Duration::from_secs(1),
        )
        .await;
    if let Some(id) = lease["lease_id"].as_str().filter(|_| status == 201) {
        recorder
            .call(
                http,
                (replica, &base),
                Kind::Revoke,
                name,
                Some(id),
                json!({}),
                Duration::from_secs(1),
                None,
            )
            .await;
    }
}

/// A resume through a live replica other than `from`, as answered.
struct Resume {
    replica: usize,
    invoked: Duration,
    answered: Duration,
    status: u16,
    body: Value,
}

/// Resume `lease` through another live replica than `from`, telling `took_over` what it
/// answered: that replica and the new stream, while it holds the lease (none when the
/// resume failed, or no other replica is up).
async fn resume_elsewhere(
    http: &reqwest::Client,
    bases: &Bases,
    name: &str,
    lease: &str,
    from: usize,
    recorder: &Recorder,
    took_over: &(dyn Fn(&Resume) + Sync),
) -> Option<(usize, EventStream)> {
    let (replica, base) = live_replicas(bases).into_iter().find(|(i, _)| *i != from)?;
    let invoked = recorder.started.elapsed();
    let (stream, answer) = resume(http, &base, name, lease).await;
    let answered = recorder.started.elapsed();
    let (status, body) = match answer {
        Resumed::Held(body) => (200, body),
        Resumed::Refused(status, body) => (status, body),
        Resumed::Unknown => (0, Value::Null),
    };
    recorder
        .resumes
        .fetch_add(usize::from(status == 200), Ordering::Relaxed);
    took_over(&Resume {
        replica,
        invoked,
        answered,
        status,
        body,
    });
    stream.map(|s| (replica, s))
}

/// What a resume was answered.
enum Resumed {
    /// `resumed`, with the lease body.
    Held(Value),
    /// Refused: before the stream (its status) or with `failed` (its error's).
    Refused(u16, Value),
    /// No answer in time, or the connection broke.
    Unknown,
}

/// Open a held stream at `url`: the stream, or what refused it before any event (its
/// status and body; 0 when no answer came).
async fn open_stream(
    http: &reqwest::Client,
    url: String,
    body: &Value,
) -> Result<EventStream, (u16, Value)> {
    let request = http.post(url).header("accept", "text/event-stream");
    match request.json(body).send().await {
        Ok(response) if response.status() == 200 => Ok(EventStream::read(response)),
        Ok(response) => {
            let status = response.status().as_u16();
            Err((status, response.json().await.unwrap_or(Value::Null)))
        }
        Err(_) => Err((0, Value::Null)),
    }
}

/// Resume `lease` of `name` through the replica at `base`: the new stream, while it holds
/// the lease, and what it answered.
async fn resume(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    lease: &str,
) -> (Option<EventStream>, Resumed) {
    let url = format!("{base}/locks/{name}/leases/{lease}/hold");
    let mut stream = match open_stream(http, url, &json!({})).await {
        Ok(stream) => stream,
        Err((0, _)) => return (None, Resumed::Unknown),
        Err((status, body)) => return (None, Resumed::Refused(status, body)),
    };
    match tokio::time::timeout(ANSWER_WITHIN, stream.next()).await {
        Ok(Some((event, body))) if event == "resumed" => (Some(stream), Resumed::Held(body)),
        Ok(Some((event, body))) if event == "failed" => {
            (None, Resumed::Refused(failed_status(&body), body))
        }
        _ => (None, Resumed::Unknown),
    }
}
