use super::*;
use proptest::prelude::*;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        ".{0,20}".prop_map(Value::Str),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
        proptest::collection::vec(".{0,8}", 0..4).prop_map(Value::Strs),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            list_of(inner.clone()).prop_map(Value::List),
            proptest::collection::vec(list_of(inner), 0..3).prop_map(Value::Lists),
        ]
    })
}

fn list_of(v: impl Strategy<Value = Value>) -> impl Strategy<Value = NvList> {
    proptest::collection::vec(("[a-z:]{1,12}", v), 0..6).prop_map(|items| {
        let mut l = NvList::new();
        for (n, v) in items {
            let _ = l.set(n, v);
        }
        l
    })
}

proptest! {
    #[test]
    fn decode_takes_back_what_encode_wrote(l in list_of(value())) {
        let b = l.encode();
        prop_assert_eq!(NvList::decode(&b), Ok(l));
    }

    #[test]
    fn every_cut_or_flipped_encoding_is_refused_or_reencodes_the_same(
        l in list_of(value()), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8,
    ) {
        let b = l.encode();
        let short = &b[..cut.index(b.len().max(1)).min(b.len().saturating_sub(1))];
        prop_assert!(NvList::decode(short).is_err(), "a cut-short list decodes");
        if !b.is_empty() {
            let mut bad = b.clone();
            let at = flip.index(bad.len());
            bad[at] ^= 1 << bit;
            // A flipped bit may still spell a valid list (a number changes): then it is
            // exactly what it encodes to, never something else.
            if let Ok(d) = NvList::decode(&bad) {
                prop_assert_eq!(d.encode(), bad);
            }
        }
    }
}

#[test]
fn names_are_unique_and_removal_keeps_the_order() {
    let mut l = NvList::new();
    for i in 0..100u64 {
        l.add(format!("n{i}"), Value::U64(i)).expect("add");
    }
    assert_eq!(l.add("n5", Value::Bool(true)), Err(Error::Exists("n5".into())));
    for i in (0..100u64).filter(|i| i % 3 != 0) {
        assert_eq!(l.remove(&format!("n{i}")), Some(Value::U64(i)));
    }
    assert_eq!(l.remove("n1"), None);
    let left: Vec<u64> = l.iter().map(|(_, v)| if let Value::U64(n) = v { *n } else { u64::MAX }).collect();
    assert_eq!(left, (0..100).filter(|i| i % 3 == 0).collect::<Vec<u64>>());
    assert_eq!(l.get_u64("n99"), Some(99));
    assert!(l.items.len() <= 2 * l.len() + 8, "holes are compacted");
    l.add("n1", Value::Str("back".into())).expect("a removed name can come back");
    assert_eq!(l.iter().last().map(|(n, _)| n), Some("n1"));
    assert_eq!(l.set("n1", Value::Bool(false)), Ok(Some(Value::Str("back".into()))));
    assert_eq!(l.add("", Value::Bool(true)), Err(Error::BadName(0)));
    assert!(l.add("x".repeat(256), Value::Bool(true)).is_err());
}

#[test]
fn hostile_encodings_are_refused_without_large_allocations() {
    // A count of 4 billion items in 4 bytes.
    assert!(NvList::decode(&u32::MAX.to_le_bytes()).is_err());
    // A name given twice.
    let mut b = 2u32.to_le_bytes().to_vec();
    for _ in 0..2 {
        b.extend_from_slice(&[1, b'a', 1, 1]);
    }
    assert_eq!(NvList::decode(&b), Err(Error::Decode("a name given twice")));
    // Nesting past MAX_DEPTH.
    let mut deep = NvList::new();
    for _ in 0..=MAX_DEPTH + 1 {
        let mut outer = NvList::new();
        outer.add("l", Value::List(deep)).expect("add");
        deep = outer;
    }
    assert_eq!(NvList::decode(&deep.encode()), Err(Error::Decode("nested too deeply")));
    // Trailing bytes, unknown types, bad flags.
    let mut ok = NvList::new();
    ok.add("a", Value::Bool(true)).expect("add");
    let mut trailing = ok.encode();
    trailing.push(0);
    assert!(NvList::decode(&trailing).is_err());
    let mut bad_type = ok.encode();
    bad_type[6] = 9;
    assert!(NvList::decode(&bad_type).is_err());
    let mut bad_flag = ok.encode();
    bad_flag[7] = 2;
    assert!(NvList::decode(&bad_flag).is_err());
}

#[test]
fn a_batch_of_many_items_costs_linear_time() {
    // 200,000 names: quadratic work would take minutes; linear takes well under a second
    // in a debug build. (The assertion is on the result, not the time.)
    let mut l = NvList::new();
    for i in 0..200_000u64 {
        l.add(format!("pool/ds@snap{i}"), Value::U64(i)).expect("add");
    }
    let d = NvList::decode(&l.encode()).expect("decode");
    assert_eq!(d.len(), 200_000);
    assert_eq!(d.get_u64("pool/ds@snap123456"), Some(123_456));
}
