//! Administrative calls (`crest dataset …`): one name-value list in, one out
//! (docs/protocol.md §5). A call on many names answers for each (`results`: name → "ok"
//! or the error), in one transaction, and costs O(names); everything a call changed is
//! committed before its answer goes.

use super::*;
use crest_nvlist::{NvList, Value};
use s::datasets::{check_prop, show_prop, DatasetInfo};

/// Most names one call may carry.
pub const MAX_ADMIN_NAMES: usize = 100_000;

/// A call's failure: errno and message.
type Failed = (i32, String);

fn err_of(e: &s::Error) -> Failed {
    (e.errno(), e.to_string())
}

fn invalid(msg: impl Into<String>) -> Failed {
    (22, msg.into())
}

fn text<'a>(call: &'a NvList, name: &str) -> Result<&'a str, Failed> {
    call.get_str(name).ok_or_else(|| invalid(format!("argument {name:?} missing or not text")))
}

/// Properties given as text (`name` → `Str`), checked and typed as stored.
fn typed_props(call: &NvList) -> Result<Vec<(String, Option<Value>)>, Failed> {
    let mut out = Vec::new();
    if let Some(given) = call.get("props") {
        let Value::List(given) = given else { return Err(invalid("props must be a list")) };
        for (k, v) in given.iter() {
            let Value::Str(v) = v else { return Err(invalid(format!("property {k}: a text value"))) };
            out.push((k.to_string(), Some(check_prop(k, v).map_err(|e| err_of(&e))?)));
        }
    }
    if let Some(Value::Strs(clear)) = call.get("clear") {
        out.extend(clear.iter().map(|k| (k.clone(), None)));
    }
    Ok(out)
}

/// A dataset as `list` and `get` answer it: `name`, `id`, `inodes`, `props` (as text).
fn describe(d: &DatasetInfo) -> NvList {
    let mut l = NvList::new();
    let mut props = NvList::new();
    for (k, v) in d.props.iter() {
        let _ = props.add(k, Value::Str(show_prop(k, v)));
    }
    let _ = l.add("name", Value::Str(d.name.clone()));
    let _ = l.add("id", Value::U64(d.id));
    let _ = l.add("inodes", Value::U64(d.inodes));
    let _ = l.add("props", Value::List(props));
    l
}

impl Server {
    /// Runs one administrative call (an encoded name-value list) at `now`; returns the
    /// encoded answer. Never fails: a bad call is answered with `error`.
    pub fn admin(&mut self, call: &[u8], now: p::Time) -> Vec<u8> {
        let answer = match NvList::decode(call) {
            Ok(call) => self.admin_call(&call, now),
            Err(e) => Err(invalid(format!("not a name-value list: {e}"))),
        };
        let answer = answer.and_then(|a| match self.store.commit() {
            Ok(()) => Ok(a),
            Err(e) => Err(err_of(&e)),
        });
        match answer {
            Ok(l) => l.encode(),
            Err((errno, message)) => {
                let mut l = NvList::new();
                let _ = l.add("error", Value::Str(message));
                let _ = l.add("errno", Value::U64(errno.unsigned_abs().into()));
                l.encode()
            }
        }
    }

    fn admin_call(&mut self, call: &NvList, now: p::Time) -> Result<NvList, Failed> {
        let mut out = NvList::new();
        match text(call, "cmd")? {
            "dataset.create" => {
                let name = text(call, "name")?;
                let mut props = NvList::new();
                for (k, v) in typed_props(call)? {
                    if let Some(v) = v {
                        props.set(k, v).map_err(|e| invalid(e.to_string()))?;
                    }
                }
                let owner = |k: &str, dflt: u64| call.get_u64(k).unwrap_or(dflt);
                let (uid, gid, mode) = (owner("uid", 0), owner("gid", 0), owner("mode", 0o755));
                let id = u32::try_from(uid).ok().zip(u32::try_from(gid).ok()).zip(u32::try_from(mode).ok());
                let Some(((uid, gid), mode)) = id else { return Err(invalid("uid, gid and mode are 32-bit")) };
                let d =
                    self.store.create_dataset(name, props, (uid, gid, mode), time_in(now)).map_err(|e| err_of(&e))?;
                tracing::info!(dataset = name, id = d, "dataset created");
                let _ = out.add("id", Value::U64(d));
            }
            "dataset.list" => {
                let all = self.store.datasets().iter().map(describe).collect();
                let _ = out.add("datasets", Value::Lists(all));
            }
            "dataset.get" => {
                let d = self.store.dataset(text(call, "name")?).map_err(|e| err_of(&e))?;
                let _ = out.add("dataset", Value::List(describe(&d)));
            }
            "dataset.set" => {
                let name = text(call, "name")?;
                self.store.set_dataset_props(name, &typed_props(call)?).map_err(|e| err_of(&e))?;
                tracing::info!(dataset = name, "dataset properties set");
            }
            "dataset.destroy" => {
                let Some(Value::Strs(names)) = call.get("names") else {
                    return Err(invalid("argument \"names\" missing or not a list of texts"));
                };
                if names.len() > MAX_ADMIN_NAMES {
                    return Err(invalid(format!("{} names in one call (at most {MAX_ADMIN_NAMES})", names.len())));
                }
                let mut results = NvList::new();
                for name in names {
                    let r = match self.store.dataset_id(name) {
                        Ok(d) if self.dataset_in_use(d) => Err(format!("dataset {name} is mounted")),
                        Ok(_) => self.store.destroy_dataset(name).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if r.is_ok() {
                        tracing::info!(dataset = %name, "dataset destroyed");
                    }
                    // (A name given twice is answered once, for its first time.)
                    let _ = results.add(name.clone(), Value::Str(r.err().unwrap_or_else(|| "ok".into())));
                }
                let _ = out.add("results", Value::List(results));
            }
            other => return Err(invalid(format!("unknown command {other:?}"))),
        }
        Ok(out)
    }
}
