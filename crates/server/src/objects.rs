//! The server's access to the data store of an image that keeps file data in objects
//! (docs/objects.md): it signs, for each transfer, the URL a client PUTs or GETs one
//! object with, and the URLs its own collector and scrub DELETE and list with. Clients
//! never see the store's keys: a URL names one object and one method, and expires.
//! Sans-I/O: signing takes the time it signs at.

use crest_proto as p;
use crest_store::fs::objects::DataStore;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use std::time::Duration;

/// How long a signed URL stays good. A transfer that outlives it is refused by the store
/// and asked for again.
pub const URL_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// Where the data store is and the keys to it (from the server's environment or config,
/// never from a client).
#[derive(Clone)]
pub struct DataConfig {
    /// `http(s)://host[:port]` of the S3 endpoint.
    pub endpoint: String,
    /// The region signed for (`us-east-1` where the store has none).
    pub region: String,
    /// Access key id.
    pub key: String,
    /// Secret access key.
    pub secret: String,
    /// Session token of temporary credentials.
    pub token: Option<String>,
}

impl std::fmt::Debug for DataConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataConfig {{ endpoint: {}, region: {}, key: {} }}", self.endpoint, self.region, self.key)
    }
}

/// Signs the URLs of one image's objects.
#[derive(Clone)]
pub struct DataAccess {
    bucket: Bucket,
    creds: Credentials,
    /// `PREFIX/crest/<store id>/`: every object of the image is below it.
    keys_under: String,
    store: DataStore,
}

impl DataAccess {
    /// Access to `store`'s objects with `config`'s endpoint and keys.
    pub fn new(config: &DataConfig, store: &DataStore) -> Result<DataAccess, String> {
        let (bucket_name, _) = store.bucket_and_prefix().map_err(|e| e.to_string())?;
        let endpoint =
            config.endpoint.parse().map_err(|e| format!("data store endpoint {:?}: {e}", config.endpoint))?;
        let bucket = Bucket::new(endpoint, UrlStyle::Path, bucket_name, config.region.clone())
            .map_err(|e| format!("data store endpoint {:?}: {e}", config.endpoint))?;
        let creds = match &config.token {
            Some(t) => Credentials::new_with_token(config.key.clone(), config.secret.clone(), t.clone()),
            None => Credentials::new(config.key.clone(), config.secret.clone()),
        };
        let probe = store.object_key(0);
        let keys_under = probe.trim_end_matches(|c| c != '/').to_string();
        Ok(DataAccess { bucket, creds, keys_under, store: store.clone() })
    }

    /// The prefix every object of the image's key starts with.
    pub fn keys_under(&self) -> &str {
        &self.keys_under
    }

    /// The object id a key of the image names, if it is one.
    pub fn id_of_key(&self, key: &str) -> Option<u64> {
        let hex = key.strip_prefix(&self.keys_under)?;
        (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
    }

    /// A URL to PUT object `id` with, once: the request must carry `If-None-Match: *`.
    pub fn put_url(&self, id: u64, now: p::Time) -> String {
        let key = self.store.object_key(id);
        let mut a = self.bucket.put_object(Some(&self.creds), &key);
        a.headers_mut().insert("if-none-match", "*");
        a.sign_with_time(URL_LIFETIME, &timestamp(now)).to_string()
    }

    /// A URL to GET object `id` with (any byte range of it).
    pub fn get_url(&self, id: u64, now: p::Time) -> String {
        let key = self.store.object_key(id);
        self.bucket.get_object(Some(&self.creds), &key).sign_with_time(URL_LIFETIME, &timestamp(now)).to_string()
    }

    /// A URL to DELETE object `id` with.
    pub fn delete_url(&self, id: u64, now: p::Time) -> String {
        let key = self.store.object_key(id);
        self.bucket.delete_object(Some(&self.creds), &key).sign_with_time(URL_LIFETIME, &timestamp(now)).to_string()
    }

    /// One request deleting objects `ids` (S3 DeleteObjects, at most `MAX_DELETE_BATCH`):
    /// the POST URL, its XML body and that body's Content-MD5.
    pub fn delete_many(&self, ids: &[u64], now: p::Time) -> DeleteBatch {
        let keys: Vec<rusty_s3::actions::ObjectIdentifier> =
            ids.iter().map(|&id| rusty_s3::actions::ObjectIdentifier::new(self.store.object_key(id))).collect();
        let mut a = self.bucket.delete_objects(Some(&self.creds), keys.iter());
        a.set_quiet(true);
        let url = a.sign_with_time(URL_LIFETIME, &timestamp(now)).to_string();
        let (body, content_md5) = a.body_with_md5();
        DeleteBatch { ids: ids.to_vec(), url, body, content_md5 }
    }

    /// A URL listing the image's objects (ListObjectsV2), from `token` on.
    pub fn list_url(&self, token: Option<&str>, now: p::Time) -> String {
        self.list_url_under(&self.keys_under, token, now)
    }

    /// A URL listing the bucket's keys under `prefix`, from `token` on.
    pub fn list_url_under(&self, prefix: &str, token: Option<&str>, now: p::Time) -> String {
        let mut a = self.bucket.list_objects_v2(Some(&self.creds));
        a.with_prefix(prefix.to_string());
        if let Some(t) = token {
            a.with_continuation_token(t.to_string());
        }
        a.sign_with_time(URL_LIFETIME, &timestamp(now)).to_string()
    }
}

/// Most objects one DeleteObjects request names (S3's limit).
pub const MAX_DELETE_BATCH: usize = 1000;

/// A DeleteObjects request for the collector to send.
#[derive(Clone, Debug)]
pub struct DeleteBatch {
    /// The objects it deletes.
    pub ids: Vec<u64>,
    /// Presigned POST URL.
    pub url: String,
    /// Its XML body.
    pub body: String,
    /// The body's Content-MD5 (S3 requires it).
    pub content_md5: String,
}

/// The ids of `batch` that a DeleteObjects answer (`xml`) says were not deleted (a key
/// gone already counts as deleted).
pub fn not_deleted(access: &DataAccess, batch: &DeleteBatch, xml: &str) -> Result<Vec<u64>, String> {
    let r = rusty_s3::actions::DeleteObjectsResponse::parse(xml).map_err(|e| format!("delete answer: {e}"))?;
    let failed: Vec<u64> = r
        .errors
        .iter()
        .filter(|e| e.code != "NoSuchKey")
        .filter_map(|e| access.id_of_key(&percent_decoded(&e.key)))
        .collect();
    Ok(batch.ids.iter().copied().filter(|id| failed.contains(id)).collect())
}

/// Keys and continuation token of a ListObjectsV2 answer. The listing is asked with
/// `encoding-type=url`; stores differ in what they encode then (RADOS Gateway encodes
/// `/` too), so every key is decoded.
pub fn parse_listing(xml: &str) -> Result<(Vec<String>, Option<String>), String> {
    let r = rusty_s3::actions::ListObjectsV2::parse_response(xml).map_err(|e| format!("object listing: {e}"))?;
    Ok((r.contents.into_iter().map(|c| percent_decoded(&c.key)).collect(), r.next_continuation_token))
}

/// `s` with its `%XX` escapes decoded (a malformed one is kept as it is).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex =
            b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn timestamp(t: p::Time) -> jiff::Timestamp {
    jiff::Timestamp::new(t.sec, t.nsec.min(999_999_999) as i32).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> DataAccess {
        let config = DataConfig {
            endpoint: "http://127.0.0.1:7480".into(),
            region: "us-east-1".into(),
            key: "KEY".into(),
            secret: "SECRET".into(),
            token: None,
        };
        let store = DataStore { url: "s3://bucket/pre".into(), store_id: 0xabc };
        DataAccess::new(&config, &store).expect("access")
    }

    #[test]
    fn urls_name_one_object_and_method_and_carry_no_secret() {
        let a = access();
        let now = p::Time { sec: 1_800_000_000, nsec: 0 };
        let put = a.put_url(7, now);
        assert!(put.starts_with("http://127.0.0.1:7480/bucket/pre/crest/0000000000000abc/0000000000000007?"), "{put}");
        assert!(put.contains("if-none-match"), "the PUT signs If-None-Match: {put}");
        assert!(!put.contains("SECRET"));
        assert_ne!(a.get_url(7, now), a.get_url(8, now));
        assert_ne!(a.get_url(7, now), put);
        assert_eq!(a.id_of_key("pre/crest/0000000000000abc/0000000000000007"), Some(7));
        assert_eq!(a.id_of_key("pre/crest/0000000000000abd/0000000000000007"), None);
        assert_eq!(a.id_of_key("pre/crest/0000000000000abc/7"), None);
        assert!(a.list_url(None, now).contains("list-type=2"));
    }

    #[test]
    fn a_batch_delete_names_its_keys_and_only_real_errors_keep_an_id() {
        let a = access();
        let now = p::Time { sec: 1_800_000_000, nsec: 0 };
        let b = a.delete_many(&[3, 4, 5], now);
        assert!(b.url.contains("delete"), "{}", b.url);
        for id in [3u64, 4, 5] {
            assert!(b.body.contains(&format!("pre/crest/0000000000000abc/{id:016x}")), "{}", b.body);
        }
        assert!(!b.content_md5.is_empty());
        let xml = "<?xml version=\"1.0\"?><DeleteResult>\
            <Error><Key>pre/crest/0000000000000abc/0000000000000004</Key><Code>InternalError</Code><Message>m</Message></Error>\
            <Error><Key>pre/crest/0000000000000abc/0000000000000005</Key><Code>NoSuchKey</Code><Message>m</Message></Error>\
            </DeleteResult>";
        assert_eq!(not_deleted(&a, &b, xml).expect("answer"), vec![4]);
        assert_eq!(not_deleted(&a, &b, "<DeleteResult></DeleteResult>").expect("quiet answer"), Vec::<u64>::new());
    }

    #[test]
    fn listed_keys_are_decoded() {
        assert_eq!(percent_decoded("a%2Fb%2f0000%zz%4"), "a/b/0000%zz%4");
        let xml = "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name><Prefix>p/</Prefix><MaxKeys>1000</MaxKeys>\
            <IsTruncated>false</IsTruncated><Contents><Key>p%2Fcrest%2Fx</Key><LastModified>2026-11-29T13:36:02.925Z</LastModified>\
            <ETag>e</ETag><Size>6</Size><StorageClass>STANDARD</StorageClass></Contents><KeyCount>1</KeyCount></ListBucketResult>";
        assert_eq!(parse_listing(xml).expect("listing").0, vec!["p/crest/x".to_string()]);
    }
}
