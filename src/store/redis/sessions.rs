//! Sessions on a Redis master or cluster (session.lua): a session's record, the holds it
//! carries, and on a cluster the record of each slot its holds are in.

use super::steps::SessionOp;
use super::*;

impl RedisNode {
    /// One step on one session record (a single master's, or one of a cluster's), with
    /// the cluster slots its answer lists. With `note`, the step is a home record's 'note'
    /// of that slot.
    async fn session_record(
        &self,
        record: &str,
        marker: &str,
        step: SessionStep<'_>,
        note: Option<Note>,
    ) -> NodeResult<(Owned<SessionState>, Vec<u16>)> {
        let attached;
        let op = match (step, note) {
            (_, Some(Note(slot))) => SessionOp::Note(slot),
            (SessionStep::Open { ttl_ms, owner }, None) => SessionOp::Open {
                ttl_ms,
                owner: owner.map(Owner::as_str),
            },
            (SessionStep::Renew { ttl_ms, stream }, None) => SessionOp::Renew { ttl_ms, stream },
            (SessionStep::Read, None) => SessionOp::Read,
            (SessionStep::End { stream }, None) => SessionOp::End { stream },
            (SessionStep::Attach { hold }, None) => {
                attached = self.keys.session_entry(hold);
                SessionOp::Attach {
                    lease: hold.lease.as_str(),
                    entry: &attached.0,
                    keys: &attached.1,
                    create: None,
                }
            }
        };
        let call = steps::session(record, marker, op);
        self.session_answer(call, step, note.is_none()).await
    }

    /// A hold's part in one slot record of a cluster's session, which is made first from
    /// `create` (the home's state) when missing.
    async fn session_attach(
        &self,
        record: &str,
        marker: &str,
        lease: &str,
        entry: &str,
        keys: &[String],
        create: Option<&SessionState>,
    ) -> NodeResult<Owned<SessionState>> {
        let op = SessionOp::Attach {
            lease,
            entry,
            keys,
            create,
        };
        let call = steps::session(record, marker, op);
        let hold = SessionHold {
            key: LockKey::mutex(""),
            lease: LeaseId::stored(lease),
            token: FencingToken::default(),
        };
        Ok(self
            .session_answer(call, SessionStep::Attach { hold: &hold }, true)
            .await?
            .0)
    }

    async fn session_answer(
        &self,
        call: Step,
        step: SessionStep<'_>,
        lists: bool,
    ) -> NodeResult<(Owned<SessionState>, Vec<u16>)> {
        let reply = self.step(call).await?;
        match reply.status()? {
            // 3: a held stream's end, and another stream keeps the session.
            0 | 3 => return Ok((Owned::NotOwner, Vec::new())),
            2 => return Ok((Owned::Yes(SessionState::default()), Vec::new())),
            _ => {}
        }
        let mut state = SessionState {
            pttl_ms: reply.uint(1)?,
            ttl_ms: reply.uint(2)?,
            owner: reply.owner(3)?,
            holds: Vec::new(),
            carried: Vec::new(),
            dropped: Vec::new(),
            attached: matches!(step, SessionStep::Attach { .. }),
            stream: None,
        };
        let mut slots = Vec::new();
        if !lists {
            return Ok((Owned::Yes(state), slots));
        }
        for at in 4..reply.0.len() {
            let text = reply.string(at)?;
            if let Some(stream) = text.strip_prefix('=') {
                state.stream = Some(stream.into());
            } else if let Some(slot) = text.strip_prefix('@') {
                slots.push(
                    slot.parse().map_err(|_| {
                        NodeError::Script(format!("a session's slot reads {text:?}"))
                    })?,
                );
            } else if matches!(step, SessionStep::Renew { .. }) {
                match text.strip_prefix('!') {
                    Some(gone) => state.dropped.push(LeaseId::stored(gone)),
                    None => state.carried.push(LeaseId::stored(text)),
                }
            } else {
                state.holds.push(parse_hold(&text).ok_or_else(|| {
                    NodeError::Script(format!("a session's hold reads {text:?}"))
                })?);
            }
        }
        Ok((Owned::Yes(state), slots))
    }

    /// A session's step (`LockNode::session`): on a master, its record; on a cluster, the
    /// home record, then each slot's.
    pub(super) async fn session_step(
        &self,
        id: &str,
        step: SessionStep<'_>,
    ) -> NodeResult<Owned<SessionState>> {
        let home = self.keys.session(id);
        if !self.keys.is_cluster() {
            let marker = self.keys.master_marker().to_owned();
            return Ok(self.session_record(&home, &marker, step, None).await?.0);
        }
        // A cluster: the home record, then each slot's (see session.lua).
        let home_slot = layout::slot_of(&home);
        let record = |slot: u16| {
            if slot == home_slot {
                (home.clone(), self.keys.marker_at(slot))
            } else {
                (self.keys.session_in(id, slot), self.keys.marker_at(slot))
            }
        };
        let (record_key, marker) = record(home_slot);
        match step {
            SessionStep::Open { .. } => Ok(self
                .session_record(&record_key, &marker, step, None)
                .await?
                .0),
            SessionStep::Attach { hold } => {
                let mut by_slot: Vec<(u16, Vec<String>)> = Vec::new();
                let (entry, keys) = self.keys.session_entry(hold);
                for key in keys {
                    let slot = layout::slot_of(&key);
                    match by_slot.iter_mut().find(|(s, _)| *s == slot) {
                        Some((_, keys)) => keys.push(key),
                        None => by_slot.push((slot, vec![key])),
                    }
                }
                let mut attached = Owned::Yes(SessionState::default());
                for (slot, keys) in by_slot {
                    let (key, marker) = record(slot);
                    let mut create = None;
                    if slot != home_slot {
                        let noted = self
                            .session_record(
                                &record_key,
                                &self.keys.marker_at(home_slot),
                                SessionStep::Read,
                                Some(Note(slot)),
                            )
                            .await?
                            .0;
                        let Owned::Yes(home_state) = noted else {
                            return Ok(Owned::NotOwner);
                        };
                        create = Some(home_state);
                    }
                    let part = slot_entry(&entry, &keys);
                    let answer = self
                        .session_attach(
                            &key,
                            &marker,
                            hold.lease.as_str(),
                            &part,
                            &keys,
                            create.as_ref(),
                        )
                        .await?;
                    match answer {
                        Owned::NotOwner => return Ok(Owned::NotOwner),
                        Owned::Yes(state) if state.attached => attached = Owned::Yes(state),
                        Owned::Yes(_) => {}
                    }
                }
                Ok(attached)
            }
            SessionStep::Renew { .. } | SessionStep::Read | SessionStep::End { .. } => {
                let (answer, slots) = self
                    .session_record(&record_key, &marker, step, None)
                    .await?;
                let Owned::Yes(mut state) = answer else {
                    return Ok(Owned::NotOwner);
                };
                // The home record decided (which stream keeps the session, whether this
                // stream's end may end it): the slots' records follow it.
                let step = match step {
                    SessionStep::Renew { .. } => SessionStep::Renew {
                        ttl_ms: Some(state.ttl_ms),
                        stream: None,
                    },
                    SessionStep::End { .. } => SessionStep::End { stream: None },
                    other => other,
                };
                let parts = futures::future::join_all(slots.iter().map(|&slot| {
                    let (key, marker) = record(slot);
                    async move { self.session_record(&key, &marker, step, None).await }
                }))
                .await;
                for part in parts {
                    if let (Owned::Yes(part), _) = part? {
                        for lease in part.carried {
                            if !state.carried.contains(&lease) {
                                state.carried.push(lease);
                            }
                        }
                        for lease in part.dropped {
                            if !state.dropped.contains(&lease) {
                                state.dropped.push(lease);
                            }
                        }
                        for hold in part.holds {
                            if !state.holds.iter().any(|h| h.lease == hold.lease) {
                                state.holds.push(hold);
                            }
                        }
                    }
                }
                Ok(Owned::Yes(state))
            }
        }
    }
}

/// A home record's note of a slot its session's holds live in.
#[derive(Debug, Clone, Copy)]
struct Note(u16);

/// The lines of a session entry that concern one slot: its first line, and the lines of
/// the keys in `keys`.
fn slot_entry(entry: &str, keys: &[String]) -> String {
    let mut lines = entry.lines();
    let mut part = lines.next().unwrap_or_default().to_owned();
    for line in lines {
        if line
            .split_once(' ')
            .is_some_and(|(_, key)| keys.iter().any(|k| k == key))
        {
            part.push('\n');
            part.push_str(line);
        }
    }
    part
}
