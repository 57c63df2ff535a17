//! What a restarted server reads back of its sessions and datasets from a possibly
//! damaged image: session records (and fenced markers), root items, dataset records and
//! the name-value lists they (and administrative calls off the wire) are. Arbitrary bytes
//! must never panic the decoders; anything they accept must be exactly what the encoder
//! writes (so a damaged record is refused, never half-read), and a session record never
//! names a hole at or above its own place.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = crest_server::fuzzing::session_record(data);
    let generation = u64::from(data.first().copied().unwrap_or(0)) << 8;
    let _ = crest_store::store::fuzzing::root_item(data, generation);
    let _ = crest_store::store::fuzzing::dataset_record(data);
    if let Ok(l) = crest_nvlist::NvList::decode(data) {
        assert_eq!(l.encode(), data, "a name-value list decodes to what encodes it");
    }
});
