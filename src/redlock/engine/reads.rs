//! The engine's reads: a lease as a majority hold it (check), who holds a key (inspect,
//! an observer's sight), a several-name lease's members, a semaphore's slots, and a page of
//! held locks. None of them writes; each decides on the masters' answers as `quorum` says.

use super::*;

impl Redlock {
    pub(super) async fn read(
        &self,
        key: &LockKey,
        only: Option<&LeaseId>,
    ) -> Result<(Option<quorum::Agreed>, Duration), EngineError> {
        self.read_as(key, |replies| quorum::decide_read(replies, only))
            .await?
            .ok_or_else(|| unavailable("a grant of this name is being decided", Vec::new()))
    }

    /// A read decided by `decide`; `None` when it found the holder unsettled.
    async fn read_as(
        &self,
        key: &LockKey,
        decide: impl Fn(&[Option<NodeResult<Option<Holding>>>]) -> Option<ReadOutcome>,
    ) -> Result<Option<(Option<quorum::Agreed>, Duration)>, EngineError> {
        let started = Instant::now();
        let Round {
            outcome, failures, ..
        } = self
            .fan_out(
                "read",
                self.config.master_timeout,
                |_, node| {
                    let key = key.clone();
                    // A mutex has at most one holder on each master.
                    Box::pin(async move { node.read(&key).await.map(|h| h.into_iter().next()) })
                },
                decide,
            )
            .await;
        match outcome {
            Some(ReadOutcome::Held(agreed)) => Ok(Some((Some(agreed), started.elapsed()))),
            Some(ReadOutcome::Free) => Ok(Some((None, started.elapsed()))),
            Some(ReadOutcome::Unsettled) => Ok(None),
            Some(ReadOutcome::Unavailable) | None => Err(unavailable(
                "fewer than a majority of masters answered, or they disagree",
                failures,
            )),
        }
    }

    /// The lease as a majority of masters hold it now.
    pub async fn check(&self, key: &LockKey, lease: &LeaseId) -> Result<Leased, EngineError> {
        let (agreed, elapsed) = self.read(key, Some(lease)).await?;
        let agreed = agreed.ok_or(EngineError::NotFound)?;
        let ttl = Duration::from_millis(agreed.ttl_ms);
        let remaining = Duration::from_millis(agreed.pttl_ms).saturating_sub(elapsed);
        let validity = remaining.saturating_sub(self.drift(ttl));
        if validity.is_zero() {
            return Err(EngineError::NotFound);
        }
        Ok(Leased {
            token: agreed.token,
            ttl,
            validity,
            remaining,
            owner: agreed.owner,
            at: Instant::now(),
            kept_by: None,
        })
    }

    /// Who holds `key`, if a majority agree that someone does.
    pub async fn inspect(&self, key: &LockKey) -> Result<Option<Holder>, EngineError> {
        let (agreed, elapsed) = self.read(key, None).await?;
        Ok(agreed.map(|a| Holder::of(key, a, elapsed)))
    }

    /// How long a lock-delay still refuses grants of the free lock `key`: the longest
    /// wait a majority of masters still impose (the majority-th longest of their answers),
    /// since a grant needs a majority and each of those refuses it until its own delay
    /// lapses. `None` when fewer than a majority run one. Every master is asked; fewer than
    /// a majority answering is a 503.
    pub async fn lock_delay(&self, key: &LockKey) -> Result<Option<Duration>, EngineError> {
        let n = self.nodes.len();
        let needed = quorum::majority(n);
        let Round {
            outcome, failures, ..
        } = self
            .fan_out(
                "delay",
                self.config.master_timeout,
                |_, node| {
                    let key = key.clone();
                    Box::pin(async move { node.lock_delay(&key).await })
                },
                |replies: &[Option<NodeResult<Option<Duration>>>]| {
                    if replies.iter().any(Option::is_none) {
                        return None;
                    }
                    let mut left: Vec<Duration> = replies
                        .iter()
                        .filter_map(|r| match r {
                            Some(Ok(d)) => Some(d.unwrap_or_default()),
                            _ => None,
                        })
                        .collect();
                    if left.len() < needed {
                        return Some(None);
                    }
                    left.sort_unstable_by(|a, b| b.cmp(a));
                    Some(Some(left[needed - 1]))
                },
            )
            .await;
        match outcome {
            Some(Some(left)) => Ok((!left.is_zero()).then_some(left)),
            Some(None) | None => Err(unavailable(
                "fewer than a majority of masters answered",
                failures,
            )),
        }
    }

    /// Who holds `key`, for an observer: every master's answer is awaited, and a holder
    /// whose masters report different tokens (its grant is still being decided) is
    /// `Unsettled` rather than reported with a token it may not be given.
    pub(crate) async fn sight(&self, key: &LockKey) -> Result<Sighting, EngineError> {
        Ok(
            match self.read_as(key, quorum::decide_settled_read).await? {
                Some((agreed, elapsed)) => {
                    Sighting::Settled(agreed.map(|a| Holder::of(key, a, elapsed)))
                }
                None => Sighting::Unsettled,
            },
        )
    }

    /// The names of the several-name lease `lease`, read through its hold of the mutex
    /// `key`: from the first master that has them (a lease's names never change), or
    /// `None` when no master that answered does.
    pub(crate) async fn members(
        &self,
        key: &LockKey,
        lease: &LeaseId,
    ) -> Result<Option<String>, EngineError> {
        let lease = lease.clone();
        let Round {
            outcome, failures, ..
        } = self
            .fan_out(
                "members",
                self.config.master_timeout,
                |_, node| {
                    let (key, lease) = (key.clone(), lease.clone());
                    Box::pin(async move { node.members(&key, &lease).await })
                },
                |replies: &[Option<NodeResult<Option<String>>>]| {
                    let found = replies
                        .iter()
                        .flatten()
                        .find_map(|r| r.clone().ok().flatten());
                    match found {
                        Some(names) => Some(Some(names)),
                        None if replies.iter().all(Option::is_some) => Some(None),
                        None => None,
                    }
                },
            )
            .await;
        let q = quorum::majority(self.nodes.len());
        match outcome {
            Some(Some(names)) => Ok(Some(names)),
            Some(None) if self.nodes.len() - failures.len() >= q => Ok(None),
            _ => Err(unavailable(
                "fewer than a majority of masters answered",
                failures,
            )),
        }
    }

    /// The slots below `limit` of semaphore `name` that a majority of masters hold, in slot
    /// order, with their holders: one batched step per master.
    pub(crate) async fn slots(
        &self,
        name: &str,
        limit: u16,
    ) -> Result<Vec<(u16, Holder)>, EngineError> {
        let started = Instant::now();
        let shared: Arc<str> = name.into();
        let Round {
            outcome, failures, ..
        } = self
            .fan_out(
                "slots",
                self.config.master_timeout,
                |_, node| {
                    let name = shared.clone();
                    Box::pin(async move { node.slots(&name, limit).await })
                },
                all_answers,
            )
            .await;
        // As pages of a listing, so that a slot counts as held only where a majority agree
        // on its holder (`quorum::merge_pages`).
        let pages: Vec<NodeResult<ListPage>> = outcome
            .unwrap_or_default()
            .into_iter()
            .map(|answer| {
                answer.map(|held| ListPage {
                    locks: held
                        .into_iter()
                        .map(|(slot, holding)| (slot.to_string(), holding))
                        .collect(),
                    more: false,
                    last: None,
                })
            })
            .collect();
        let quorum::Merged { held, .. } = quorum::merge_pages(&pages, usize::from(limit))
            .ok_or_else(|| unavailable("fewer than a majority of masters answered", failures))?;
        let elapsed = started.elapsed();
        let mut slots: Vec<(u16, Holder)> = held
            .into_iter()
            .filter_map(|(slot, a)| {
                let slot = slot.parse().ok()?;
                Some((slot, Holder::named(format!("{name}/{slot}"), a, elapsed)))
            })
            .collect();
        slots.sort_by_key(|(slot, _)| *slot);
        Ok(slots)
    }

    /// Held locks of `kind` whose names start with `prefix` and sort after `after`, in name
    /// order, at most `limit`, with the name to continue after when there may be more.
    pub async fn list(
        &self,
        kind: Kind,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<Holder>, Option<String>), EngineError> {
        let started = Instant::now();
        let (prefix, after): (Arc<str>, Arc<str>) = (prefix.into(), after.into());
        let Round {
            outcome, failures, ..
        } = self
            .fan_out(
                "list",
                self.config.master_timeout.max(LIST_TIMEOUT_FLOOR),
                |_, node| {
                    let (prefix, after) = (prefix.clone(), after.clone());
                    // One more than asked, so that a full page knows whether more follow.
                    Box::pin(async move {
                        let listing = Listing {
                            kind,
                            prefix: &prefix,
                            after: &after,
                            limit: limit + 1,
                        };
                        node.list(listing).await
                    })
                },
                all_answers,
            )
            .await;
        let pages = outcome.unwrap_or_default();
        let quorum::Merged { held, next } = quorum::merge_pages(&pages, limit)
            .ok_or_else(|| unavailable("fewer than a majority of masters answered", failures))?;
        let elapsed = started.elapsed();
        let holders = held
            .into_iter()
            .map(|(name, a)| Holder::named(name, a, elapsed))
            .collect();
        Ok((holders, next))
    }
}
