//! Rounds of a worker that holds a name through a held stream (`POST /locks/{name}/hold`):
//! the server renews the lease while the connection lives, and the worker ends its hold by
//! closing the connection, the holder's revoke.
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
use super::{Bases, Recorder, live_replicas, pick_live};

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
        stream_round(&mut rng, &http, &bases, name, &recorder).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
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
            Ok(Some((event, body))) => match event.as_str() {
                "heartbeat" => {
                    let at = recorder.started.elapsed();
                    record_at(at_replica, Kind::Renew, 200, Some(&lease), at, at, &body);
                }
                // This release stopping: the holder resumes through another replica, which
                // renews the lease at once (recorded as that renew).
                "closed" if body["resume"] == true => {
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
                "jeopardy" => {
                    recorder.jeopardies.fetch_add(1, Ordering::Relaxed);
                }
                // The previous release revoked a held stream's lease when its replica
                // stopped, and said so with `lost`: its holder relies on nothing from then.
                "lost" if body["reason"] == "shutting_down" => {
                    let_go(at_replica);
                    open = false;
                }
                // The hold is over (or left to lapse): nothing to revoke.
                "lost" | "closed" => open = false,
                _ => {}
            },
            // The replica went (killed): the lease lapses at its TTL.
            Ok(None) => open = false,
        }
    }
    if open && stream.is_some() {
        // Closing the stream is the holder's revoke: from now on it relies on nothing.
        // Recorded with an unknown outcome (status 0): the server revokes when it sees the
        // connection closed (or its grace ends), a moment the client does not learn.
        let_go(at_replica);
        drop(stream);
    }
    recorder.streams.fetch_add(1, Ordering::Relaxed);
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
    match http.post(url).json(body).send().await {
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
