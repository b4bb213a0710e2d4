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
/// How long a quiet subscription waits for the answer to its ping before it counts the
/// shard as gone: a shard busy with another replica's burst of subscriptions can be slow to
/// answer, and subscribing again would add a burst of its own.
const PONG_WAIT: Duration = Duration::from_secs(5);

/// One primary's subscription (see `Cluster::listen`), until `stop` or an error.
pub(super) fn listen_on(
    url: &str,
    channels: &[[String; 2]],
    tx: &tokio::sync::mpsc::UnboundedSender<Heard>,
    stop: &std::sync::atomic::AtomicBool,
) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
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
    conn.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut pinged: Option<std::time::Instant> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match conn.recv_response() {
            Ok(Value::Array(parts)) => {
                pinged = None;
                let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
                let kind = parts.first().and_then(text).unwrap_or_default();
                match kind.as_str() {
                    "smessage" => {
                        if let (Some(channel), Some(payload)) =
                            (parts.get(1).and_then(text), parts.get(2).and_then(text))
                        {
                            let _ = tx.send(Heard::Message(channel, payload));
                        }
                    }
                    // The server drops a slot's channels when the slot moves away.
                    "sunsubscribe" => {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "a slot moved; subscribing again",
                        )));
                    }
                    _ => {}
                }
            }
            Ok(_) => pinged = None,
            Err(e) if e.is_timeout() => match pinged {
                // Quiet: a ping shows whether the node is still there.
                None => {
                    conn.send_packed_command(&redis::cmd("PING").get_packed_command())?;
                    pinged = Some(std::time::Instant::now());
                }
                Some(at) if at.elapsed() > PONG_WAIT => return Err(e),
                Some(_) => {}
            },
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
