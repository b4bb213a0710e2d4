//! Announcements through a master's pub/sub channels: releases that wake waiting grants on
//! every replica, and grants, releases and proclamations that reach observers.

use super::*;

impl RedisNode {
    /// Hear the master's (or cluster's) announcements for this replica (`LockNode::listen`):
    /// a subscription kept up until `shutdown`, re-made when its connection fails.
    pub(super) fn listen_for_announcements(&self, listener: Listener, shutdown: CancellationToken) {
        let address = self.address.clone();
        let subscribe: Box<
            dyn Fn(bool) -> futures::future::BoxFuture<'static, Result<(), redis::RedisError>>
                + Send,
        > = match &self.wire {
            Wire::Master(master) => {
                let (released, events) = self.keys.master_channels();
                let channels = Arc::new(Channels {
                    released: released.to_owned(),
                    events: events.to_owned(),
                });
                let (client, listener) = (master.client.clone(), listener.clone());
                let heard = self.subscribed.clone();
                Box::new(move |first| {
                    let (client, channels, listener, heard) = (
                        client.clone(),
                        channels.clone(),
                        listener.clone(),
                        heard.clone(),
                    );
                    Box::pin(async move {
                        subscribe_and_forward(&client, &channels, &listener, first, &heard).await
                    })
                })
            }
            Wire::Cluster(cluster) => {
                let (cluster, listener) = (cluster.clone(), listener.clone());
                let heard = self.subscribed.clone();
                Box::new(move |first| {
                    let (cluster, listener, heard) =
                        (cluster.clone(), listener.clone(), heard.clone());
                    Box::pin(async move {
                        let subscribed = listener.clone();
                        cluster
                            .listen(
                                |channel, payload| {
                                    if channel == "released" {
                                        listener(Announcement::Freed(payload));
                                    } else if let Some(announced) = parse_event(payload) {
                                        listener(announced);
                                    }
                                },
                                move || {
                                    heard.store(true, std::sync::atomic::Ordering::Relaxed);
                                    if !first {
                                        subscribed(Announcement::Missed);
                                    }
                                },
                            )
                            .await
                            .map_err(|e| {
                                redis::RedisError::from((
                                    redis::ErrorKind::Io,
                                    "a shard's subscription",
                                    e.to_string(),
                                ))
                            })
                    })
                })
            }
        };
        let heard = self.subscribed.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            let mut first = true;
            loop {
                let session = subscribe(first);
                let ended = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ended = session => ended,
                };
                heard.store(false, std::sync::atomic::Ordering::Relaxed);
                match ended {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(e) => {
                        tracing::debug!(master = %address, error = %e, "announcement subscription lost; reconnecting")
                    }
                }
                first = false;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(crate::model::jittered(backoff)) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
    }
}

/// How often the announcement subscription is pinged. A subscription whose connection the
/// server closed does not end on its own; a failed ping is how it is noticed.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(1);

/// An announcement from the events channel; `None` for one this version does not know.
fn parse_event(payload: &str) -> Option<Announcement<'_>> {
    let mut parts = payload.splitn(3, ' ');
    let (kind, token, name) = (parts.next()?, parts.next()?.parse().ok()?, parts.next()?);
    let token = FencingToken::new(token);
    match kind {
        "acquired" => Some(Announcement::Acquired(name, token)),
        "released" => Some(Announcement::Released(name, token)),
        "evicted" => Some(Announcement::Evicted(name, token)),
        "proclaimed" => Some(Announcement::Proclaimed(name, token)),
        _ => None,
    }
}

/// The pub/sub channels the replicas announce on.
struct Channels {
    /// A revoke's release: the message is the lock name. (Its name and format predate the
    /// events channel and stay, so that replicas of different versions still wake each
    /// other's waiters.)
    released: String,
    /// `acquired <token> <name>` (a grant decided on a majority), `released <token>
    /// <name>` (a revoke) and `proclaimed <token> <name>` (a leader's new value); `<name>`
    /// is the key's topic.
    events: String,
}

/// Subscribe to the announcement channels and hand every message to `listener` until the
/// connection fails. After a re-subscription, announcements may have been missed
/// meanwhile: the listener is told so.
async fn subscribe_and_forward(
    client: &redis::Client,
    channels: &Channels,
    listener: &Listener,
    first: bool,
    heard: &std::sync::atomic::AtomicBool,
) -> Result<(), redis::RedisError> {
    let timed_out = || redis::RedisError::from((redis::ErrorKind::Io, "subscription timed out"));
    let pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
        .await
        .map_err(|_| timed_out())??;
    let (mut sink, mut messages) = pubsub.split();
    tokio::time::timeout(
        Duration::from_secs(2),
        sink.subscribe(&[&channels.released, &channels.events]),
    )
    .await
    .map_err(|_| timed_out())??;
    heard.store(true, std::sync::atomic::Ordering::Relaxed);
    if !first {
        listener(Announcement::Missed);
    }
    let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => {
                    let Ok(payload) = msg.get_payload::<String>() else { continue };
                    if msg.get_channel_name() == channels.released {
                        listener(Announcement::Freed(&payload));
                    } else if let Some(announced) = parse_event(&payload) {
                        listener(announced);
                    }
                }
                None => return Ok(()),
            },
            _ = ping.tick() => {
                tokio::time::timeout(Duration::from_secs(2), sink.ping::<Value>())
                    .await
                    .map_err(|_| timed_out())??;
            }
        }
    }
}
