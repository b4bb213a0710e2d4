//! A shard's subscription to its slots' announcement channels (`SSUBSCRIBE`), on a thread
//! of its own: what `Cluster::listen` hears from each primary.

use std::time::Duration;

use redis::Value;

/// What a primary's subscription thread reports.
pub(super) enum Heard {
    /// Every channel of its slots is subscribed.
    Subscribed,
    Message(String, String),
    /// The subscription ended (the node went away, a slot moved, or it was stopped).
    Ended(Option<String>),
}

/// How long a shard's subscription waits for each confirmation of its thousands of
/// channels: on a loaded machine a burst of them can stall for seconds, and giving up only
/// starts the burst again (seen: subscriptions that never completed within 30 s on two
/// busy cores, each attempt timing out after 2 s).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(10);
/// How long a quiet subscription waits for the answer to its liveness check before it
/// counts the shard as gone: a shard busy with another replica's burst of subscriptions can
/// be slow to answer, and subscribing again would add a burst of its own.
const PONG_WAIT: Duration = Duration::from_secs(5);
/// How long a read waits before the thread looks at `stop` (and, quiet, checks liveness).
const QUIET: Duration = Duration::from_millis(500);

/// One primary's subscription (see `Cluster::listen`), until `stop` or an error.
///
/// The connection speaks RESP3, where what a subscription hears (messages, confirmations, a
/// slot's channels dropped) arrives as push values. A read that times out leaves redis-rs
/// counting one reply to skip (it takes the reply to be late), and it skips the next value
/// that is not a push: over RESP2 that was the next message or the answer to the liveness
/// `PING`, so a quiet subscription never saw its answer and was made again every 5.5 s,
/// 2 `SSUBSCRIBE`s a slot each time. Liveness is checked by subscribing again to one channel
/// it already has, whose confirmation is a push too.
pub(super) fn listen_on(
    url: &str,
    channels: &[[String; 2]],
    tx: &tokio::sync::mpsc::UnboundedSender<Heard>,
    stop: &std::sync::atomic::AtomicBool,
) -> redis::RedisResult<()> {
    use redis::{IntoConnectionInfo as _, ProtocolVersion, PushKind};
    let info = url.into_connection_info()?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(SUBSCRIBE_WAIT))?;
    let mut packed = Vec::new();
    for pair in channels {
        packed.extend(redis::cmd("SSUBSCRIBE").arg(&pair[..]).get_packed_command());
    }
    conn.send_packed_command(&packed)?;
    for _ in 0..channels.len() * 2 {
        conn.recv_response()?;
    }
    let _ = tx.send(Heard::Subscribed);
    let Some([check, _]) = channels.first() else {
        // A primary that serves no slot has nothing to announce: it waits to be stopped, as
        // a subscription would, rather than end and be made again at once.
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(QUIET);
        }
        return Ok(());
    };
    let check = redis::cmd("SSUBSCRIBE").arg(check).get_packed_command();
    conn.set_read_timeout(Some(QUIET))?;
    let mut checked: Option<std::time::Instant> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match conn.recv_response() {
            Ok(Value::Push { kind, data }) => {
                checked = None;
                let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
                match kind {
                    PushKind::SMessage => {
                        if let (Some(channel), Some(payload)) =
                            (data.first().and_then(text), data.get(1).and_then(text))
                        {
                            let _ = tx.send(Heard::Message(channel, payload));
                        }
                    }
                    // The server drops a slot's channels when the slot moves away.
                    PushKind::SUnsubscribe => {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "a slot moved; subscribing again",
                        )));
                    }
                    _ => {}
                }
            }
            Ok(_) => checked = None,
            Err(e) if e.is_timeout() => match checked {
                // Quiet: subscribing again to a channel it has shows whether the node is
                // still there.
                None => {
                    conn.send_packed_command(&check)?;
                    checked = Some(std::time::Instant::now());
                }
                Some(at) if at.elapsed() > PONG_WAIT => return Err(e),
                Some(_) => {}
            },
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
