use super::*;
use crate::store::node::{NodeError, Owned};

/// A lease id as the masters hold it.
fn id(lease: &str) -> LeaseId {
    LeaseId::stored(lease)
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[test]
fn majority_of_n() {
    assert_eq!([1, 2, 3, 4, 5, 6, 7].map(majority), [1, 2, 2, 3, 3, 4, 4]);
}

#[test]
fn validity_subtracts_elapsed_and_drift() {
    // 10 s TTL, 1% drift = 100 ms + 2 ms; 30 ms elapsed.
    assert_eq!(validity(ms(10_000), ms(30), 0.01), Some(ms(9_868)));
    assert_eq!(validity(ms(100), ms(97), 0.01), None);
    assert_eq!(validity(ms(100), ms(200), 0.01), None);
    assert_eq!(validity(ms(100), ms(0), 0.0), Some(ms(98)));
}

fn granted(t: u64) -> Option<NodeResult<Acquired>> {
    Some(Ok(Acquired::Granted {
        token: FencingToken::new(t),
    }))
}
fn held(p: u64) -> Option<NodeResult<Acquired>> {
    held_by("L", p)
}
fn held_by(lease: &str, p: u64) -> Option<NodeResult<Acquired>> {
    Some(Ok(Acquired::Held {
        pttl_ms: p,
        lease: id(lease),
    }))
}
fn down<T>() -> Option<NodeResult<T>> {
    Some(Err(NodeError::Timeout))
}

#[test]
fn grant_decides_as_soon_as_a_majority_answers() {
    assert_eq!(
        decide_grant(&[granted(5), granted(5), None]),
        Some(GrantOutcome::Won {
            token: FencingToken::new(5),
            confirmed: 2
        })
    );
    assert_eq!(decide_grant(&[granted(5), None, None]), None);
    assert_eq!(
        decide_grant(&[granted(7), granted(5), None]),
        Some(GrantOutcome::Won {
            token: FencingToken::new(7),
            confirmed: 1
        })
    );
}

#[test]
fn grant_tells_held_from_unavailable() {
    assert_eq!(
        decide_grant(&[held(900), held(1000), None]),
        Some(GrantOutcome::Held {
            retry_after: ms(900)
        })
    );
    // One holder and one failure: the holder alone could not block, but together
    // they do; the lock frees when the one held key expires.
    assert_eq!(
        decide_grant(&[held(400), down(), granted(1)]),
        Some(GrantOutcome::Held {
            retry_after: ms(400)
        })
    );
    // ...but while the third may still fail too, it is not yet contention.
    assert_eq!(decide_grant(&[held(400), down(), None]), None);
    assert_eq!(
        decide_grant(&[down(), down(), None]),
        Some(GrantOutcome::Unavailable)
    );
    assert_eq!(
        decide_grant(&[down(), down(), held(10)]),
        Some(GrantOutcome::Unavailable)
    );
    // Five masters, three held: two must expire before three are free.
    assert_eq!(
        decide_grant(&[held(300), held(100), held(200), granted(1), granted(1)]),
        Some(GrantOutcome::Held {
            retry_after: ms(100)
        })
    );
    assert_eq!(
        decide_grant(&[held(300), held(100), held(200), held(50), granted(1)]),
        Some(GrantOutcome::Held {
            retry_after: ms(100)
        })
    );
}

#[test]
fn a_split_vote_is_not_a_holder() {
    // Three contenders, one master each: nobody holds a majority, nobody waits for a TTL.
    assert_eq!(
        decide_grant(&[granted(4), held_by("B", 30_000), held_by("C", 30_000)]),
        Some(GrantOutcome::Split)
    );
    // Five masters, two contenders with two each and this grant with one.
    assert_eq!(
        decide_grant(&[
            granted(1),
            held_by("B", 9_000),
            held_by("B", 9_000),
            held_by("C", 9_000),
            held_by("C", 9_000),
        ]),
        Some(GrantOutcome::Split)
    );
    // The third answer may make B a majority holder: wait for it.
    assert_eq!(
        decide_grant(&[held_by("B", 500), held_by("C", 900), None]),
        None
    );
    assert_eq!(
        decide_grant(&[held_by("B", 500), held_by("C", 900), held_by("B", 700)]),
        Some(GrantOutcome::Held {
            retry_after: ms(500)
        })
    );
    // A failed master may be B's second key: B may hold the lock.
    assert_eq!(
        decide_grant(&[held_by("B", 500), down(), granted(3)]),
        Some(GrantOutcome::Held {
            retry_after: ms(500)
        })
    );
}

#[test]
fn a_renew_whose_first_answers_disagree_on_the_token_waits_for_the_rest() {
    let renewed = |token: u64| {
        Some(Ok(Owned::Yes(Holding {
            lease: id("a"),
            token: FencingToken::new(token),
            ttl_ms: 1000,
            pttl_ms: 1000,
            owner: None,
            stream: None,
        })))
    };
    // The second master's late acquire has not been given the grant's token 9 yet.
    assert_eq!(decide_renew(&[renewed(9), renewed(7), None]), None);
    match decide_renew(&[renewed(9), renewed(7), renewed(9)]) {
        Some(OwnedOutcome::Done(holdings)) => {
            assert_eq!(agree(&holdings, 3).map(|a| a.token.get()), Some(9));
        }
        other => panic!("unexpected {other:?}"),
    }
    // Nothing more will come: decided as before (the engine answers 503).
    assert!(matches!(
        decide_renew(&[renewed(9), renewed(7), down()]),
        Some(OwnedOutcome::Done(_))
    ));
    assert!(matches!(
        decide_renew(&[renewed(9), renewed(9), None]),
        Some(OwnedOutcome::Done(_))
    ));
}

#[test]
fn confirm_is_decided_by_a_majority() {
    let ok = || Some(Ok(()));
    assert_eq!(decide_confirm(&[ok(), ok(), None]), Some(true));
    assert_eq!(decide_confirm(&[ok(), None, None]), None);
    assert_eq!(decide_confirm(&[ok(), down(), None]), None);
    assert_eq!(decide_confirm(&[ok(), down(), down()]), Some(false));
}

#[test]
fn renew_needs_a_majority_of_owners() {
    let yes = |v: u64| Some(Ok(Owned::Yes(v)));
    let no = || Some(Ok(Owned::<u64>::NotOwner));
    let done = Some(OwnedOutcome::Done(vec![1, 1]));
    let not_owner = Some(OwnedOutcome::NotOwner);
    let unavailable = Some(OwnedOutcome::Unavailable);
    assert_eq!(decide_owned(&[yes(1), yes(1), None]), done);
    assert_eq!(decide_owned(&[yes(1), no(), None]), None);
    assert_eq!(decide_owned(&[no(), no(), None]), not_owner);
    assert_eq!(decide_owned(&[no(), down(), yes(1)]), unavailable);
    assert_eq!(decide_owned(&[down(), down(), yes(1)]), unavailable);
    // A master that is out (quarantined: it answers at once) does not decide "unavailable"
    // while the others' denials, still on their way, could make a majority deny.
    assert_eq!(decide_owned(&[down(), no(), None]), None);
    assert_eq!(decide_owned::<u64>(&[down(), None, None]), None);
    assert_eq!(decide_owned(&[down(), no(), no()]), not_owner);
    let five = |replies: [Option<NodeResult<Owned<u64>>>; 5]| decide_owned(&replies);
    assert_eq!(five([down(), down(), no(), no(), None]), None);
    assert_eq!(five([down(), down(), no(), no(), no()]), not_owner);
    assert_eq!(five([down(), down(), down(), no(), None]), unavailable);
}

#[test]
fn release_outcomes() {
    let yes = || Some(Ok(Owned::Yes(())));
    let no = || Some(Ok(Owned::NotOwner));
    let err = || Some(Err(NodeError::Timeout));
    let silent = || None;
    let released = Some(ReleaseOutcome::Released);
    let not_found = Some(ReleaseOutcome::NotFound);
    let unavailable = Some(ReleaseOutcome::Unavailable);
    assert_eq!(decide_release(&[yes(), yes(), yes()]), released);
    assert_eq!(decide_release(&[yes(), yes(), err()]), released);
    // A majority deleted it: the silent master's release is the backlog's business.
    assert_eq!(decide_release(&[yes(), yes(), silent()]), released);
    // A leftover on one master is deleted, but the lease held no majority: 404.
    assert_eq!(decide_release(&[yes(), no(), no()]), not_found);
    assert_eq!(decide_release(&[no(), no(), silent()]), not_found);
    // The master that did not answer may make it a majority: cannot tell.
    assert_eq!(decide_release(&[yes(), no(), err()]), unavailable);
    assert_eq!(decide_release(&[yes(), no(), silent()]), None);
    assert_eq!(decide_release(&[no(), no(), err()]), not_found);
    assert_eq!(decide_release(&[yes(), err(), err()]), unavailable);
    assert_eq!(decide_release(&[no(), err(), err()]), unavailable);
    assert_eq!(decide_release(&[yes(), silent(), silent()]), None);
}

fn holding(lease: &str, token: u64, pttl: u64) -> Option<NodeResult<Option<Holding>>> {
    Some(Ok(Some(Holding {
        lease: id(lease),
        token: FencingToken::new(token),
        ttl_ms: 1000,
        pttl_ms: pttl,
        owner: None,
        stream: None,
    })))
}

/// A renew learns which held stream keeps a lease only from a majority of masters: a
/// resume that reached one master does not yet displace the stream it came from.
#[test]
fn the_stream_that_keeps_a_lease_is_the_one_a_majority_name() {
    let renewed = |stream: &str| Holding {
        lease: id("a"),
        token: FencingToken::new(3),
        ttl_ms: 1000,
        pttl_ms: 1000,
        owner: None,
        stream: Some(stream.into()),
    };
    let kept_by = |holdings: &[Holding]| agree(holdings, 3).and_then(|a| a.stream);
    assert_eq!(
        kept_by(&[renewed("s2"), renewed("s2")]).as_deref(),
        Some("s2")
    );
    assert_eq!(kept_by(&[renewed(""), renewed("s2")]), None);
    assert_eq!(
        kept_by(&[renewed(""), renewed("s2"), renewed("")]).as_deref(),
        Some("")
    );
}

/// A session's stream is learnt the same way: a majority of all masters (not of those
/// that answered) must name it.
#[test]
fn the_stream_that_keeps_a_session_is_the_one_a_majority_of_all_masters_name() {
    let renewed = |stream: &str| crate::store::node::SessionState {
        stream: Some(stream.into()),
        ..Default::default()
    };
    let kept_by = |states: &[crate::store::node::SessionState]| {
        agree_on_session_stream(states, 5).map(|s| s.to_string())
    };
    assert_eq!(
        kept_by(&[renewed("s2"), renewed("s2"), renewed("s2")]).as_deref(),
        Some("s2")
    );
    assert_eq!(kept_by(&[renewed("s2"), renewed("s2"), renewed("")]), None);
    assert_eq!(kept_by(&[renewed("s2"), renewed("s2")]), None);
    let unsaid = crate::store::node::SessionState::default();
    assert_eq!(kept_by(&[unsaid.clone(), unsaid.clone(), unsaid]), None);
}

#[test]
fn read_finds_the_majority_holder_and_its_token() {
    let outcome = decide_read(&[holding("a", 4, 900), holding("a", 4, 800), None], None);
    match outcome {
        Some(ReadOutcome::Held(agreed)) => {
            assert_eq!((agreed.lease.as_str(), agreed.token.get()), ("a", 4));
            assert_eq!(agreed.pttl_ms, 800);
        }
        other => panic!("unexpected {other:?}"),
    }
    let free = Some(Ok(None));
    assert_eq!(
        decide_read(&[holding("a", 4, 900), free.clone(), free.clone()], None),
        Some(ReadOutcome::Free)
    );
    assert_eq!(
        decide_read(&[holding("a", 4, 900), free.clone(), None], None),
        None
    );
    assert_eq!(
        decide_read(
            &[holding("a", 4, 900), holding("a", 4, 900), free],
            Some(&id("b"))
        ),
        Some(ReadOutcome::Free)
    );
    assert_eq!(
        decide_read(&[holding("a", 4, 900), down(), down()], None),
        Some(ReadOutcome::Unavailable)
    );
    // The failed master may be the second holder: cannot tell.
    assert_eq!(
        decide_read(&[holding("a", 4, 900), down(), Some(Ok(None))], None),
        Some(ReadOutcome::Unavailable)
    );
    assert_eq!(
        decide_read(&[Some(Ok(None)), down(), Some(Ok(None))], None),
        Some(ReadOutcome::Free)
    );
}

fn page(names: &[&str], more: bool) -> NodeResult<ListPage> {
    let Some(Ok(Some(h))) = holding("a", 4, 900) else {
        unreachable!()
    };
    Ok(ListPage {
        locks: names.iter().map(|n| (n.to_string(), h.clone())).collect(),
        more,
        last: names.last().map(|n| n.to_string()),
    })
}

fn names(merged: &Merged) -> Vec<&str> {
    merged.held.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn pages_merge_by_majority_and_never_skip_a_name() {
    // Every master listed everything: the majority's names, no cursor.
    let merged = merge_pages(
        &[
            page(&["a", "b"], false),
            page(&["a"], false),
            page(&["b"], false),
        ],
        10,
    )
    .unwrap();
    assert_eq!(
        (names(&merged), merged.next.as_deref()),
        (vec!["a", "b"], None)
    );
    // The second master stopped at "b": nothing past it is known yet, "c" waits for
    // the next page even though two masters listed it.
    let merged = merge_pages(
        &[
            page(&["a", "c"], false),
            page(&["a", "b"], true),
            page(&["a", "c"], false),
        ],
        10,
    )
    .unwrap();
    assert_eq!(
        (names(&merged), merged.next.as_deref()),
        (vec!["a"], Some("b"))
    );
    // A full page continues after its last name.
    let merged = merge_pages(
        &[
            page(&["a", "b", "c"], false),
            page(&["a", "b", "c"], false),
            Err(NodeError::Timeout),
        ],
        2,
    )
    .unwrap();
    assert_eq!(
        (names(&merged), merged.next.as_deref()),
        (vec!["a", "b"], Some("b"))
    );
    assert_eq!(
        merge_pages(
            &[
                page(&["a"], false),
                Err(NodeError::Timeout),
                Err(NodeError::Timeout)
            ],
            2
        ),
        None
    );
}

#[test]
fn read_needs_a_majority_to_agree_on_the_token() {
    // The third master may still send the missing vote.
    assert_eq!(
        decide_read(&[holding("a", 4, 900), holding("a", 9, 900), None], None),
        None
    );
    assert_eq!(
        decide_read(&[holding("a", 4, 900), holding("a", 9, 900), down()], None),
        Some(ReadOutcome::Unavailable)
    );
    match decide_read(
        &[
            holding("a", 4, 900),
            holding("a", 9, 900),
            holding("a", 4, 700),
        ],
        None,
    ) {
        Some(ReadOutcome::Held(agreed)) => assert_eq!(agreed.token, 4),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_observers_read_waits_for_every_master_and_for_the_token_to_settle() {
    // A majority agree on token 4, but the third master holds the same lease with 9: its
    // grant may have chosen 9 and be writing it back. Never report 4 as its term.
    let deciding = [
        holding("a", 4, 900),
        holding("a", 4, 900),
        holding("a", 9, 900),
    ];
    assert_eq!(decide_settled_read(&deciding), Some(ReadOutcome::Unsettled));
    assert_eq!(
        decide_settled_read(&[holding("a", 4, 900), holding("a", 4, 900), None]),
        None,
        "the third master may hold it with another token"
    );
    match decide_settled_read(&[holding("a", 9, 900), holding("a", 9, 900), down()]) {
        Some(ReadOutcome::Held(agreed)) => assert_eq!(agreed.token, 9),
        other => panic!("unexpected {other:?}"),
    }
    let free = Some(Ok(None));
    assert_eq!(
        decide_settled_read(&[holding("a", 9, 900), free.clone(), free]),
        Some(ReadOutcome::Free)
    );
}

/// A master's answer to a session renew: the holds it carried and those it found gone.
fn session(carried: &[&str], dropped: &[&str]) -> crate::store::node::SessionState {
    crate::store::node::SessionState {
        carried: carried.iter().copied().map(id).collect(),
        dropped: dropped.iter().copied().map(id).collect(),
        ..Default::default()
    }
}

#[test]
fn a_session_hold_is_lost_only_when_a_majority_deny_it() {
    let ids = |v: &[&str]| v.iter().copied().map(id).collect::<Vec<_>>();
    // (answers of the masters that renewed, out of n) => (kept, unconfirmed, lost)
    type Case<'a> = (
        Vec<crate::store::node::SessionState>,
        usize,
        [&'a [&'a str]; 3],
    );
    let cases: Vec<Case> = vec![
        // Carried by two of three: kept, whoever else answered.
        (
            vec![session(&["h"], &[]), session(&["h"], &[])],
            3,
            [&["h"], &[], &[]],
        ),
        // One carrier answered, the other did not; the third never had it: unconfirmed.
        (
            vec![session(&["h"], &[]), session(&[], &[])],
            3,
            [&[], &["h"], &[]],
        ),
        // One carrier answered, the other found it gone: with the third, a majority deny.
        (
            vec![
                session(&["h"], &[]),
                session(&[], &["h"]),
                session(&[], &[]),
            ],
            3,
            [&[], &[], &["h"]],
        ),
        // Gone from both answering masters (the third silent): a majority deny.
        (
            vec![session(&[], &["h"]), session(&[], &["h"])],
            3,
            [&[], &[], &["h"]],
        ),
        // Five masters, three answered: two carry it, one denies; two silent.
        (
            vec![
                session(&["h"], &[]),
                session(&["h"], &[]),
                session(&[], &[]),
            ],
            5,
            [&[], &["h"], &[]],
        ),
    ];
    for (i, (states, n, [kept, unconfirmed, lost])) in cases.into_iter().enumerate() {
        let verdicts = judge_session_holds(&states, n);
        assert_eq!(verdicts.kept, ids(kept), "case {i}");
        assert_eq!(verdicts.unconfirmed, ids(unconfirmed), "case {i}");
        assert_eq!(verdicts.lost, ids(lost), "case {i}");
    }
}

#[test]
fn a_session_renew_waits_for_a_silent_carrier_only_while_a_hold_is_undecided() {
    use crate::store::node::Owned;
    let yes = |s| Some(Ok(Owned::Yes(s)));
    // A carries h, C answered without it, B silent: B decides whether h is kept.
    assert_eq!(
        decide_session_renew(&[yes(session(&["h"], &[])), None, yes(session(&[], &[]))]),
        None
    );
    // A and C both carry it: kept whatever B says.
    assert!(
        decide_session_renew(&[yes(session(&["h"], &[])), None, yes(session(&["h"], &[]))])
            .is_some()
    );
    // A and C both deny it: lost whatever B says.
    assert!(
        decide_session_renew(&[yes(session(&[], &["h"])), None, yes(session(&[], &[]))]).is_some()
    );
}
