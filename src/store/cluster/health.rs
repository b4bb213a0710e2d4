//! Each shard's health inside a cluster (the module doc's "Shard health"): quarantine,
//! restoring a shard's slots, verifying a shard whose connection broke, catching a jumped
//! clock, and the probe that does them each round.

use super::*;

/// A cursor of `Cluster::held` packs the slot map's generation (7 bits), the index of the
/// shard being read (8 bits) and that shard's SCAN cursor (48 bits: a SCAN cursor is below
/// its table's size), under a top bit that keeps every cursor but the first from being 0.
const HELD_SCAN_BITS: u32 = 48;

fn held_cursor(generation: u64, shard: usize, scan: u64) -> u64 {
    1 << 63 | (generation & 0x7f) << 56 | (shard as u64) << HELD_SCAN_BITS | scan
}

impl Cluster {
    /// One page of every hold the cluster carries, shard by shard in the slot map's order,
    /// for the quarantine of another master that lost its data (`LockNode::held`), each key
    /// as a single master names it (`Keys::untagged`). `None`, so that the read goes on
    /// without this cluster or starts again later, while a page could miss some: the slot
    /// map is not whole, or changed since the read began (a key that moved may have been
    /// in neither shard's part), or the shard to read does not vote (what it lost would be
    /// counted as carried nowhere, which is the truth, but counted against a whole
    /// cluster's vote).
    pub(crate) async fn held(
        &self,
        cursor: u64,
        script: &Script,
        pattern: &str,
        count: u64,
    ) -> NodeResult<Option<HeldPage>> {
        let topology = self.topology();
        if topology.problem.is_some() || topology.shards.len() > 0xff {
            return Ok(None);
        }
        let (at, scan) = if cursor == 0 {
            (0, 0)
        } else if (cursor >> 56) & 0x7f != topology.generation & 0x7f {
            return Ok(None);
        } else {
            (
                ((cursor >> HELD_SCAN_BITS) & 0xff) as usize,
                cursor & ((1 << HELD_SCAN_BITS) - 1),
            )
        };
        let Some(shard) = topology.shards.get(at) else {
            return Ok(None);
        };
        let voting = shard.admits().is_ok() && {
            let health = shard.health();
            health.marked && health.quarantine.is_none() && health.layout.is_none()
        };
        if !voting {
            return Ok(None);
        }
        let mut conn = shard.upkeep.clone();
        let reply: Vec<Value> = tokio::time::timeout(
            UPKEEP_TIMEOUT,
            script
                .prepare_invoke()
                .arg(scan)
                .arg(pattern)
                .arg(count)
                .invoke_async(&mut conn),
        )
        .await
        .map_err(|_| NodeError::Timeout)?
        .map_err(|e| self.failed(shard, &e))?;
        let mut page = super::super::redis::held_page(reply)?;
        for (key, _, _) in &mut page.holds {
            *key = self.keys.untagged(key);
        }
        page.next = if page.next >> HELD_SCAN_BITS != 0 {
            return Ok(None);
        } else if page.next != 0 {
            held_cursor(topology.generation, at, page.next)
        } else if at + 1 < topology.shards.len() {
            held_cursor(topology.generation, at + 1, 0)
        } else {
            0
        };
        Ok(Some(page))
    }

    /// Quarantine `shard` for `why`, unless it already is.
    pub(super) fn quarantine(&self, shard: &Shard, why: &'static str) {
        let mut health = shard.health();
        if health.quarantine.is_none() {
            health.why = Some(why);
            tracing::warn!(
                shard = %shard.address,
                quarantine_ms = self.policy.quarantine.as_millis() as u64,
                "a shard of this cluster has lost its data; the names in its slots get no vote from this cluster until every lease it may have held has expired"
            );
            health.quarantine = Some((
                Instant::now() + self.policy.quarantine,
                SystemTime::now() + self.policy.quarantine,
            ));
            health.losses += 1;
            health.outstanding = None;
        }
    }

    /// The shards quarantined for lost data whose quarantine no read of the other
    /// masters' holds has shortened yet (`LockNode::lost_shards`).
    pub(crate) fn lost_shards(&self) -> Vec<LostShard> {
        self.topology()
            .shards
            .iter()
            .filter_map(|shard| {
                let health = shard.health();
                (health.quarantine.is_some() && health.outstanding.is_none()).then(|| LostShard {
                    address: shard.address.clone(),
                    loss: health.losses,
                })
            })
            .collect()
    }

    /// Let `lost`'s quarantine end within `left` (`LockNode::shorten_shard`), unless that
    /// loss is over.
    pub(crate) fn shorten_shard(&self, lost: &LostShard, left: Duration, outstanding: usize) {
        let Some(shard) = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&lost.address)
            .cloned()
        else {
            return;
        };
        let mut health = shard.health();
        if health.losses != lost.loss {
            return;
        }
        let Some((until, wall)) = &mut health.quarantine else {
            return;
        };
        let now = Instant::now();
        if now + left < *until {
            *until = now + left;
            *wall = SystemTime::now() + left;
        }
        tracing::info!(
            shard = %shard.address,
            outstanding,
            quarantine_left_ms = until.saturating_duration_since(now).as_millis() as u64,
            "the holds on the other masters are read: the shard stays out until the last one that may have relied on it ends"
        );
        health.outstanding = Some(outstanding);
    }

    /// Run `script` once per slot of `slots` on `shard`, pipelined, as `step(slot)` (its
    /// builder in `store::redis::steps`) says.
    pub(super) async fn per_slot(
        &self,
        shard: &Shard,
        slots: &[u16],
        script: &Script,
        step: impl Fn(u16) -> Step,
    ) -> NodeResult<()> {
        let mut conn = shard.upkeep.clone();
        script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(|e| self.failed(shard, &e))?;
        for chunk in slots.chunks(512) {
            let mut pipe = redis::pipe();
            for &slot in chunk {
                step(slot).pipe_to(&mut pipe, script);
            }
            tokio::time::timeout(
                UPKEEP_TIMEOUT.max(self.timeout * 4),
                pipe.query_async::<()>(&mut conn),
            )
            .await
            .map_err(|_| NodeError::Timeout)?
            .map_err(|e| self.failed(shard, &e))?;
        }
        Ok(())
    }

    /// Raise the counter of each of `slots` to `fence` and leave its marker with
    /// `identity`.
    pub(crate) async fn restore_slots(
        &self,
        shard: &Shard,
        slots: &[u16],
        fence: u64,
        identity: &str,
        run: Option<&str>,
        restore: &Script,
    ) -> NodeResult<()> {
        self.per_slot(shard, slots, restore, |slot| {
            steps::restore(
                &self.keys.fence_at(slot),
                &self.keys.marker_at(slot),
                fence,
                identity,
                run,
            )
        })
        .await
    }

    /// Remove the markers of `slots` on `shard`: their scripts refuse until restored.
    pub(super) async fn unmark_slots(&self, shard: &Shard, slots: &[u16]) -> NodeResult<()> {
        let mut conn = shard.upkeep.clone();
        for chunk in slots.chunks(512) {
            let mut pipe = redis::pipe();
            for &slot in chunk {
                pipe.cmd("DEL").arg(self.keys.marker_at(slot)).ignore();
            }
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(|e| self.failed(shard, &e))?;
        }
        Ok(())
    }

    /// Remove every marker that carries `identity`: the engine judged the whole cluster
    /// to have gone back in time.
    pub(crate) async fn unmark_all(&self, identity: &str, unmark: &Script) -> NodeResult<()> {
        for (shard, slots) in self.shards() {
            self.per_slot(&shard, &slots, unmark, |slot| {
                steps::unmark(&self.keys.marker_at(slot), identity)
            })
            .await?;
            self.quarantine(&shard, UNMARKED);
        }
        Ok(())
    }

    /// Restore every shard (the engine's restore of the whole cluster: a new deployment,
    /// or its quarantine over).
    pub(crate) async fn restore_all(
        &self,
        fence: u64,
        identity: &str,
        restore: &Script,
    ) -> NodeResult<()> {
        let floor = self.floor(fence);
        let shards = self.shards();
        // Each shard's first slot last: a probe judges a shard by it, so no replica sees
        // some shards marked and others not while this restore is under way (it would take
        // those for shards that lost their data).
        for (shard, slots) in &shards {
            self.restore_slots(
                shard,
                slots.get(1..).unwrap_or_default(),
                floor,
                identity,
                None,
                restore,
            )
            .await?;
        }
        for (shard, slots) in &shards {
            // The first slot's marker carries the shard's run record (see `probe`).
            let run = shard.health().run_id.clone();
            self.restore_slots(
                shard,
                slots.get(..1).unwrap_or_default(),
                floor,
                identity,
                run.as_deref(),
                restore,
            )
            .await?;
            let mut health = shard.health();
            health.quarantine = None;
            health.unverified_since = None;
            health.marked = true;
        }
        Ok(())
    }

    /// The counter a restored slot starts from: the wall clock in microseconds at least,
    /// which is above every token a slot can have granted (each token is one above a
    /// counter that started at a past restore's clock, and no slot grants once per
    /// microsecond), as long as the replicas' clocks agree within the quarantine.
    pub(super) fn floor(&self, fence: u64) -> u64 {
        fence.max(clock_floor())
    }

    /// Probe every shard and act on what is found (see the module's doc); answer what the
    /// engine's monitor judges the cluster by.
    pub(crate) async fn probe(
        &self,
        restore: &Script,
        verified: &Script,
    ) -> NodeResult<ClusterProbe> {
        self.refresh().await?;
        let shards = self.shards();
        let probes = futures::future::join_all(shards.iter().map(|(shard, slots)| async move {
            let Some(&rep) = slots.first() else {
                return Err(NodeError::Other("serves no slot".into()));
            };
            let mut conn = shard.conn.clone();
            let started = Instant::now();
            let read = tokio::time::timeout(
                self.timeout,
                redis::pipe()
                    .cmd("INFO")
                    .arg("server")
                    .cmd("GET")
                    .arg(self.keys.marker_at(rep))
                    .cmd("GET")
                    .arg(self.keys.fence_at(rep))
                    .cmd("TIME")
                    .cmd("GET")
                    .arg(format!("{}:layout", self.keys.marker_at(rep)))
                    .cmd("GET")
                    .arg(format!("{}:run", self.keys.marker_at(rep)))
                    .query_async::<(
                        String,
                        Option<String>,
                        Option<u64>,
                        Value,
                        Option<String>,
                        Option<String>,
                    )>(&mut conn),
            )
            .await;
            match read {
                Ok(Ok((info, marker, fence, time, layout, run_record))) => {
                    if let Some(master_us) = clock::parse_time(&time) {
                        // Refusals are the shard's own to act on, below: not an error here.
                        let _ = shard.clock.observe(Reading {
                            sent: started,
                            received: Instant::now(),
                            master_us,
                            local_us: clock::wall_us(),
                        });
                    }
                    let mut health = shard.health();
                    health.up = true;
                    health.latency = Some(started.elapsed());
                    health.layout = layout
                        .filter(|layout| layout != crate::store::layout::LAYOUT)
                        .map(|layout| crate::store::layout::unknown(&layout));
                    Ok((info, marker, fence, run_record))
                }
                Ok(Err(e)) => Err(self.failed(shard, &e)),
                Err(_) => {
                    shard.health().up = false;
                    Err(NodeError::Timeout)
                }
            }
        }))
        .await;
        let any_marked = probes.iter().any(|p| matches!(p, Ok((_, Some(_), _, _))));
        let mut out = ClusterProbe::default();
        for ((shard, slots), probe) in shards.iter().zip(&probes) {
            let Ok((info, marker, fence, run_record)) = probe else {
                continue;
            };
            let run_id = info_field(info, "run_id:");
            let uptime =
                Duration::from_secs(info_field(info, "uptime_in_seconds:").parse().unwrap_or(0));
            out.uptime = Some(out.uptime.unwrap_or(Duration::MAX).min(uptime));
            out.fence = out.fence.max(fence.unwrap_or(0));
            if out.identity.is_none() {
                out.identity.clone_from(marker);
            }
            {
                let mut health = shard.health();
                if health.run_id.as_deref().is_some_and(|old| old != run_id) {
                    tracing::warn!(shard = %shard.address, "a shard of this cluster restarted (its run_id changed)");
                    health.unverified_since.get_or_insert_with(Instant::now);
                }
                health.run_id = Some(run_id.clone());
                health.marked = marker.is_some();
            }
            if shard.clock.status().pending.is_some() {
                self.quarantine_jumped(shard, slots).await;
                continue;
            }
            if let Some(identity) = marker
                && !self
                    .judge_run(
                        shard,
                        slots,
                        identity,
                        run_record.as_deref(),
                        &run_id,
                        uptime,
                        verified,
                    )
                    .await
            {
                continue;
            }
            if marker.is_none() {
                if any_marked {
                    self.quarantine(shard, EMPTY);
                    self.restore_if_due(shard, slots, restore).await;
                }
                continue;
            }
            let restored_elsewhere = shard.health().quarantine.take().is_some();
            if restored_elsewhere {
                tracing::info!(shard = %shard.address, "shard votes again");
            }
            self.verify(shard, slots).await;
        }
        let reported = self
            .reported
            .fetch_max(out.fence, std::sync::atomic::Ordering::Relaxed);
        out.fence = out.fence.max(reported);
        Ok(out)
    }

    /// A shard's present process against its run record (its first slot's `<marker>:run`),
    /// as a single master's is judged (`redlock::health`, `catch_lossy_restarts`): a shard
    /// that restarted since its data was verified, on a persistence that may lose what it
    /// acknowledged, is quarantined as one that lost its data and its markers removed, so
    /// that every replica treats it so. A shard marked by an earlier release (no record) is
    /// judged by its uptime. Whether the shard may go on to be verified by its counters.
    #[allow(clippy::too_many_arguments)]
    async fn judge_run(
        &self,
        shard: &Arc<Shard>,
        slots: &[u16],
        identity: &str,
        record: Option<&str>,
        run_id: &str,
        uptime: Duration,
        verified: &Script,
    ) -> bool {
        if record == Some(run_id) || shard.health().run_checked.as_deref() == Some(run_id) {
            shard.health().run_checked = Some(run_id.to_owned());
            return true;
        }
        let Some(&first) = slots.first() else {
            return false;
        };
        let read = tokio::time::timeout(self.timeout, durable(&shard.conn)).await;
        let durable = match read.unwrap_or(Err(NodeError::Timeout)) {
            Ok(durable) => durable,
            Err(e) => {
                tracing::warn!(shard = %shard.address, error = %e, "could not read the persistence of a shard that restarted; it does not vote until a probe can");
                shard
                    .health()
                    .unverified_since
                    .get_or_insert_with(Instant::now);
                return false;
            }
        };
        if durable || (record.is_none() && uptime >= self.policy.quarantine) {
            let step = steps::verified(&self.keys.marker_at(first), identity, run_id);
            let mut conn = shard.conn.clone();
            let recorded: redis::RedisResult<Value> = tokio::time::timeout(
                self.timeout,
                step.invocation(verified).invoke_async(&mut conn),
            )
            .await
            .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "timed out").into()));
            if recorded.is_err() {
                shard
                    .health()
                    .unverified_since
                    .get_or_insert_with(Instant::now);
                return false;
            }
            shard.health().run_checked = Some(run_id.to_owned());
            return true;
        }
        tracing::error!(
            shard = %shard.address,
            "a shard restarted without appendonly yes and appendfsync always: the writes it acknowledged last (a grant, a renew) may be lost while its markers were kept; it stops voting"
        );
        self.quarantine(shard, LOSSY);
        match self.unmark_slots(shard, slots).await {
            Ok(()) => {
                let mut health = shard.health();
                health.marked = false;
                health.run_checked = Some(run_id.to_owned());
            }
            Err(e) => {
                tracing::warn!(shard = %shard.address, error = %e, "could not remove the markers of a shard that restarted without its last writes; it stays refused");
                shard
                    .health()
                    .unverified_since
                    .get_or_insert_with(Instant::now);
            }
        }
        false
    }

    /// A shard whose clock jumped forward: quarantined as one that lost its data, its
    /// markers removed so that every replica (and this one after a restart) treats it so.
    pub(super) async fn quarantine_jumped(&self, shard: &Arc<Shard>, slots: &[u16]) {
        tracing::error!(
            shard = %shard.address,
            "a shard's clock jumped forward: every lock on it may have expired early; it stops voting"
        );
        self.quarantine(shard, CLOCK_JUMPED);
        match self.unmark_slots(shard, slots).await {
            Ok(()) => {
                shard.clock.settle();
                shard.health().marked = false;
            }
            Err(e) => {
                tracing::warn!(shard = %shard.address, error = %e, "could not remove the markers of a shard whose clock jumped; it stays refused")
            }
        }
    }

    pub(super) async fn restore_if_due(&self, shard: &Arc<Shard>, slots: &[u16], restore: &Script) {
        let due = shard
            .health()
            .quarantine
            .is_none_or(|(until, _)| Instant::now() >= until);
        if !due && !self.policy.skip_quarantine {
            return;
        }
        let identity = format!("{:032x}", rand::random::<u128>());
        let floor = self.floor(0);
        // Its first slot last: a probe judges a shard by it, so that a shard whose restore
        // stopped half-way is still seen unmarked, and restored again.
        let (first, rest) = slots.split_at(slots.len().min(1));
        let restored = match self
            .restore_slots(shard, rest, floor, &identity, None, restore)
            .await
        {
            Ok(()) => {
                let run = shard.health().run_id.clone();
                self.restore_slots(shard, first, floor, &identity, run.as_deref(), restore)
                    .await
            }
            failed => failed,
        };
        match restored {
            Ok(()) => {
                let mut health = shard.health();
                health.quarantine = None;
                health.unverified_since = None;
                health.marked = true;
                tracing::info!(shard = %shard.address, fence = floor, "shard's quarantine over; its slots' counters raised and markers put back; it votes again");
            }
            Err(e) => {
                tracing::warn!(shard = %shard.address, error = %e, "could not restore a shard")
            }
        }
    }

    /// An unverified shard: compare each slot's counter with the highest token this
    /// process saw there; below it, the shard went back in time.
    pub(super) async fn verify(&self, shard: &Arc<Shard>, slots: &[u16]) {
        let (since, seen) = {
            let health = shard.health();
            let Some(since) = health.unverified_since else {
                return;
            };
            let owned: Vec<(u16, u64)> = health
                .seen
                .iter()
                .filter(|(slot, _)| slots.binary_search(slot).is_ok())
                .map(|(s, t)| (*s, *t))
                .collect();
            (since, owned)
        };
        if since.elapsed() < VERIFY_AFTER {
            return;
        }
        let mut conn = shard.upkeep.clone();
        let mut fell = None;
        for chunk in seen.chunks(512) {
            let mut pipe = redis::pipe();
            for (slot, _) in chunk {
                pipe.cmd("GET").arg(self.keys.fence_at(*slot));
            }
            let Ok(Ok(fences)) = tokio::time::timeout(
                UPKEEP_TIMEOUT,
                pipe.query_async::<Vec<Option<u64>>>(&mut conn),
            )
            .await
            else {
                return;
            };
            if let Some(((slot, token), fence)) = chunk
                .iter()
                .zip(fences)
                .find(|((_, token), fence)| fence.unwrap_or(0) < *token)
            {
                fell = Some((*slot, *token, fence.unwrap_or(0)));
                break;
            }
        }
        match fell {
            None => {
                shard.health().unverified_since = None;
                tracing::info!(shard = %shard.address, "shard verified: it kept its data; it votes");
            }
            Some((slot, token, fence)) => {
                tracing::error!(
                    shard = %shard.address, slot, fence, seen_before = token,
                    "a shard went back in time (a slot's fencing counter fell): it restarted from an old snapshot and may have lost locks; it stops voting"
                );
                self.quarantine(shard, ROLLED_BACK);
                let unmarked = self.unmark_slots(shard, slots).await;
                if let Err(e) = &unmarked {
                    tracing::warn!(shard = %shard.address, error = %e, "could not remove the markers of a shard that went back in time");
                }
                let mut health = shard.health();
                health.unverified_since = None;
                health.seen.retain(|s, _| slots.binary_search(s).is_err());
                health.marked = unmarked.is_err();
            }
        }
    }
}
