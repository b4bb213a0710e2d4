use super::*;

#[test]
fn names_follow_the_contract_alphabet() {
    assert!(LockName::parse("nightly-report").is_ok());
    assert!(LockName::parse("a.b_c:d~e-F9").is_ok());
    assert!(LockName::parse(&"x".repeat(256)).is_ok());
    assert!(LockName::parse("").is_err());
    assert!(LockName::parse(&"x".repeat(257)).is_err());
    for bad in ["a b", "a/b", "a*", "a?", "é", "a[1]", "a\\b", "a%20"] {
        assert!(LockName::parse(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn class_is_the_name_up_to_the_first_separator() {
    let class = |n: &str| LockName::parse(n).unwrap().class().to_owned();
    assert_eq!(class("invoice:42"), "invoice");
    assert_eq!(class("mail.daily:x"), "mail");
    assert_eq!(class("plain"), "plain");
    assert_eq!(class(":leading"), "");
}

#[test]
fn lease_ids_are_long_random_and_url_safe() {
    let a = LeaseId::generate();
    let b = LeaseId::generate();
    assert_ne!(a, b);
    assert_eq!(a.as_str().len(), 22);
    assert!(LeaseId::parse(a.as_str()).is_ok());
    assert!(LeaseId::parse("has space").is_err());
    assert!(LeaseId::parse("").is_err());
    assert!(!format!("{a:?}").contains(a.as_str()));
}

#[test]
fn a_permits_id_carries_its_slot_after_the_random_bits() {
    let base = LeaseId::generate();
    let slot = Slot { index: 2, limit: 3 };
    let permit = base.permit(slot);
    assert!(LeaseId::parse(permit.as_str()).is_ok());
    assert_eq!(permit.slot(), Some(slot));
    assert_eq!(permit.base(), base.as_str());
    assert_eq!(base.slot(), None);
    for tail in ["_3_3", "_1_1001", "_x_3", "_1", "_1_3_4", "__3", "_-1_3"] {
        let forged = LeaseId(format!("{}{tail}", base.as_str()).into());
        assert_eq!(forged.slot(), None, "{tail}");
    }
}

#[test]
fn a_shared_holds_id_says_so_and_its_key_is_announced_as_the_lock() {
    let base = LeaseId::generate();
    let shared = base.shared();
    assert!(shared.is_shared() && !base.is_shared());
    assert_eq!(shared.base(), base.as_str());
    assert_eq!(shared.slot(), None);
    assert!(!base.permit(Slot { index: 0, limit: 2 }).is_shared());
    let key = LockKey::reader("files", &shared);
    assert_eq!(key.topic(), "files");
    assert_eq!(key.owner_name(), "files");
}

#[test]
fn a_semaphores_slots_are_announced_as_the_semaphore() {
    let slot = LockKey::slot("pool", 7);
    assert_eq!(slot.topic(), "/semaphores/pool");
    assert_eq!(
        LockName::semaphore("pool").unwrap().topic(),
        "/semaphores/pool"
    );
    assert!(PermitLimit::parse(0).is_err());
    assert!(PermitLimit::parse(1001).is_err());
    assert_eq!(PermitLimit::parse(1000).unwrap().get(), 1000);
}

#[test]
fn owner_is_bounded_and_printable() {
    assert!(Owner::parse("worker-7 on host a").is_ok());
    assert!(Owner::parse(&"o".repeat(257)).is_err());
    assert!(Owner::parse("line\nbreak").is_err());
}
