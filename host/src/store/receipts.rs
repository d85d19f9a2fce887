//! Group receipts, computed when asked and exact. An ask is two statements: the senders of
//! its seqs, then one pass over the group's current members in the database that hands back
//! their positions grouped. The pass is what costs (linear in the members), so the asks of
//! one group share it: while a pass runs, the asks that arrive wait for the next one, which
//! covers every one of them (the widest range and all their senders). A group runs one pass
//! at a time however many ask, and every ask is answered from a pass that began after it
//! arrived, so it sees every read committed before it. A pass that fails answers the asks
//! it covered with its failure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use sqlx::Row as _;

use super::groups::elements;
use super::{Store, json, lookup};

/// One message's receipt: of `of` members counted, `read` read it and `delivered` got it
/// (reading counts as getting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub seq: i64,
    pub read: i64,
    pub delivered: i64,
    pub of: i64,
}

/// `members` current members at the same place (clamped to the pass's range): joined after
/// `joined_after`, read up to `read`, got up to `got` (a read counts as getting). `who`
/// names the one member when it is a sender of a seq some ask of the pass asked about.
struct Positions {
    joined_after: i64,
    read: i64,
    got: i64,
    who: Option<String>,
    members: i64,
}

/// What a pass has to cover: positions clamped to `lo..=hi` (`lo` one below the lowest seq
/// asked), with rows of their own for `senders`.
#[derive(Clone)]
struct Cover {
    lo: i64,
    hi: i64,
    senders: BTreeSet<String>,
}

impl Cover {
    /// Clamping to a wider range leaves every count inside the narrower one unchanged; a
    /// sender with a row of its own that no ask needs is counted as anyone else.
    fn covers(&self, lo: i64, hi: i64, senders: &[String]) -> bool {
        self.lo <= lo && self.hi >= hi && senders.iter().all(|s| self.senders.contains(s))
    }
}

/// One pass over a group's members.
struct Pass {
    /// The ticket count when it began: every ask with a lower ticket arrived before it.
    began: u64,
    cover: Cover,
    /// The positions, or what the database said when the pass failed: the asks it covered
    /// are answered with that too rather than running one pass after another against a
    /// database that is down, each waiting out the pool's timeout.
    positions: Result<Arc<Vec<Positions>>, String>,
}

impl Pass {
    fn outcome(&self) -> sqlx::Result<Arc<Vec<Positions>>> {
        self.positions.clone().map_err(|e| {
            sqlx::Error::Io(std::io::Error::other(format!(
                "the group's receipts pass failed: {e}"
            )))
        })
    }
}

/// A count per key; a key counted down to nothing is gone.
#[derive(Default)]
struct Counted<K>(BTreeMap<K, usize>);

impl<K: Ord + Clone> Counted<K> {
    /// One more of `k`, or one less.
    fn count(&mut self, k: &K, add: bool) {
        let n = self.0.entry(k.clone()).or_default();
        match add {
            true => *n += 1,
            false => *n -= 1,
        }
        if *n == 0 {
            self.0.remove(k);
        }
    }
}

/// What the asks of one group in flight want covered, each counted once per ask.
#[derive(Default)]
struct Wanted {
    lo: Counted<i64>,
    hi: Counted<i64>,
    senders: Counted<String>,
}

impl Wanted {
    /// One ask's wants counted in (`add`) or out.
    fn change(&mut self, lo: i64, hi: i64, senders: &[String], add: bool) {
        self.lo.count(&lo, add);
        self.hi.count(&hi, add);
        for s in senders {
            self.senders.count(s, add);
        }
    }

    fn cover(&self) -> Cover {
        Cover {
            lo: self.lo.0.keys().next().copied().unwrap_or(0),
            hi: self.hi.0.keys().next_back().copied().unwrap_or(0),
            senders: self.senders.0.keys().cloned().collect(),
        }
    }
}

#[derive(Default)]
struct Group {
    wanted: Mutex<Wanted>,
    /// The latest pass. Held while a pass runs, so a group runs one at a time; tokio's
    /// mutex is fair, so the asks take it in the order they came.
    last: tokio::sync::Mutex<Option<Arc<Pass>>>,
}

/// The groups with asks in flight. An entry lives while an ask holds it.
#[derive(Default)]
pub(super) struct Passes {
    tickets: AtomicU64,
    groups: Mutex<HashMap<i64, Arc<Group>>>,
}

/// An ask's place in its group: what it wants covered stays counted until it is dropped,
/// and the last ask of a group takes the group's entry (and its last pass) with it.
struct Entry<'a> {
    passes: &'a Passes,
    conversation_id: i64,
    group: Arc<Group>,
    lo: i64,
    hi: i64,
    senders: &'a [String],
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.group
            .wanted
            .lock()
            .unwrap()
            .change(self.lo, self.hi, self.senders, false);
        let mut groups = self.passes.groups.lock().unwrap();
        // Clones are made only under this lock: two holders are the map and this ask.
        if Arc::strong_count(&self.group) == 2 {
            groups.remove(&self.conversation_id);
        }
    }
}

impl Passes {
    /// The positions of a pass that began after this call and covers `lo..=hi` and
    /// `senders`: the one the group ran last if it does, or a new one run by `run`.
    async fn share<F, Fut>(
        &self,
        conversation_id: i64,
        lo: i64,
        hi: i64,
        senders: &[String],
        run: F,
    ) -> sqlx::Result<Arc<Vec<Positions>>>
    where
        F: FnOnce(Cover) -> Fut,
        Fut: Future<Output = sqlx::Result<Vec<Positions>>>,
    {
        let group = self
            .groups
            .lock()
            .unwrap()
            .entry(conversation_id)
            .or_default()
            .clone();
        group.wanted.lock().unwrap().change(lo, hi, senders, true);
        let entry = Entry {
            passes: self,
            conversation_id,
            group,
            lo,
            hi,
            senders,
        };
        // Taken after the wants are counted: a pass that began past this ticket read them.
        let ticket = self.tickets.fetch_add(1, SeqCst);
        let mut last = entry.group.last.lock().await;
        if let Some(pass) = last
            .as_ref()
            .filter(|p| p.began > ticket && p.cover.covers(lo, hi, senders))
        {
            return pass.outcome();
        }
        let began = self.tickets.load(SeqCst);
        let cover = entry.group.wanted.lock().unwrap().cover();
        let result = run(cover.clone()).await.map(Arc::new);
        let positions = result.as_ref().map(Arc::clone).map_err(|e| e.to_string());
        *last = Some(Arc::new(Pass {
            began,
            cover,
            positions,
        }));
        result
    }
}

impl Store {
    /// For each seq: of the current members whose membership began before it (other than
    /// its sender), how many have read it and how many got it. Two statements however many
    /// seqs are asked and however large the group: the senders, then one pass over the
    /// current members in the database that hands back their positions grouped (shared with
    /// the group's other asks, above). Positions are clamped to the seqs asked (`lo` = the
    /// lowest − 1, `hi` = the highest), which keeps every count the same, so members at the
    /// same place collapse into one row; the senders keep rows of their own, so each
    /// message's count can leave its sender out. Rows back: at most one per distinct (join,
    /// read, delivered) position inside the range, plus one per sender — for a
    /// 10,000-member group where most members sit at the same place, a handful.
    /// Per seq asked for, its receipt, or `None` for a seq not in the conversation.
    pub async fn receipts(
        &self,
        conversation_id: i64,
        seqs: &[i64],
    ) -> sqlx::Result<Vec<Option<Receipt>>> {
        let keys: Vec<(i64, i64)> = seqs.iter().map(|&seq| (conversation_id, seq)).collect();
        let sql = lookup(
            self.dialect(),
            "seq, sender_id",
            "messages",
            &[("conversation_id", true), ("seq", true)],
            "",
        );
        let mut senders: HashMap<i64, String> = HashMap::new();
        for r in sqlx::query(&sql)
            .bind(json(&keys))
            .fetch_all(self.read())
            .await?
        {
            senders.insert(r.try_get(0)?, r.try_get(1)?);
        }
        let (Some(&lo), Some(&hi)) = (senders.keys().min(), senders.keys().max()) else {
            return Ok(vec![None; seqs.len()]);
        };
        let mut distinct: Vec<String> = senders.values().cloned().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let positions = self
            .passes
            .share(conversation_id, lo - 1, hi, &distinct, |cover| {
                self.positions(conversation_id, cover)
            })
            .await?;
        Ok(seqs
            .iter()
            .map(|&seq| Some(receipt(&positions, seq, senders.get(&seq)?)))
            .collect())
    }

    /// The pass: the group's current members' positions, clamped and grouped.
    async fn positions(&self, conversation_id: i64, cover: Cover) -> sqlx::Result<Vec<Positions>> {
        crate::telemetry::receipt_pass();
        let who: Vec<[&str; 1]> = cover.senders.iter().map(|s| [s.as_str()]).collect();
        let (sender, from) = elements(self.dialect(), "$4", &[false]);
        let clamp =
            |x: &str| format!("CASE WHEN {x} < $2 THEN $2 WHEN {x} > $3 THEN $3 ELSE {x} END");
        let (read, delivered) = ("COALESCE(rp.read_seq, 0)", "COALESCE(rp.delivered_seq, 0)");
        let got = format!("CASE WHEN {delivered} > {read} THEN {delivered} ELSE {read} END");
        let sql = format!(
            "SELECT joined, read_at, got_at, who, COUNT(*) FROM (SELECT \
             {} AS joined, {} AS read_at, {} AS got_at, \
             CASE WHEN m.user_id IN (SELECT {sender} FROM {from}) THEN m.user_id END AS who \
             FROM members m LEFT JOIN read_positions rp \
             ON rp.user_id = m.user_id AND rp.conversation_id = m.conversation_id \
             WHERE m.conversation_id = $1 AND m.left_at_seq IS NULL AND m.joined_after_seq < $3) p \
             GROUP BY joined, read_at, got_at, who",
            clamp("m.joined_after_seq"),
            clamp(read),
            clamp(&got),
        );
        sqlx::query(&sql)
            .bind(conversation_id)
            .bind(cover.lo)
            .bind(cover.hi)
            .bind(json(&who))
            .fetch_all(self.read())
            .await?
            .iter()
            .map(|r| {
                Ok(Positions {
                    joined_after: r.try_get(0)?,
                    read: r.try_get(1)?,
                    got: r.try_get(2)?,
                    who: r.try_get(3)?,
                    members: r.try_get(4)?,
                })
            })
            .collect()
    }
}

/// The receipt of the message at `seq` sent by `sender`, over the current members'
/// grouped positions.
fn receipt(positions: &[Positions], seq: i64, sender: &str) -> Receipt {
    let mut r = Receipt {
        seq,
        read: 0,
        delivered: 0,
        of: 0,
    };
    for p in positions {
        if p.joined_after < seq && p.who.as_deref() != Some(sender) {
            r.of += p.members;
            r.read += p.members * i64::from(p.read >= seq);
            r.delivered += p.members * i64::from(p.got >= seq);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::pin::pin;

    use futures_util::FutureExt as _;
    use tokio::sync::oneshot;

    use super::*;

    /// A pass whose one row carries `mark`, so an ask can tell which pass it got.
    fn marked(mark: i64) -> sqlx::Result<Vec<Positions>> {
        Ok(vec![Positions {
            joined_after: 0,
            read: mark,
            got: mark,
            who: None,
            members: 1,
        }])
    }

    fn mark(pass: sqlx::Result<Arc<Vec<Positions>>>) -> i64 {
        pass.unwrap()[0].read
    }

    fn names(of: &[&str]) -> Vec<String> {
        of.iter().map(|s| s.to_string()).collect()
    }

    /// Asks that arrive while a pass runs are not answered from it (it may have read the
    /// group before what they wait to see), and share the next one, which covers the
    /// widest range and every sender they asked about. Another group's ask waits for none
    /// of them, and nothing is kept once the asks are answered.
    #[tokio::test]
    async fn asks_share_the_next_pass_never_one_begun_before_them() {
        let passes = Passes::default();
        let ran = Cell::new(0);
        let (release, gate) = oneshot::channel::<()>();
        let (s, t) = (names(&["s"]), names(&["t"]));
        let first = passes.share(7, 0, 10, &s, |cover| async move {
            assert_eq!((cover.lo, cover.hi, cover.senders.len()), (0, 10, 1));
            gate.await.unwrap();
            marked(1)
        });
        let mut first = pin!(first);
        assert!(first.as_mut().now_or_never().is_none(), "its pass waits");
        // Arriving while the first pass runs: a narrower ask, a wider one with another
        // sender, and one more like the first.
        let ran = &ran;
        let next = |lo, hi, who| {
            passes.share(7, lo, hi, who, move |cover| async move {
                ran.set(ran.get() + 1);
                assert_eq!(cover.lo, 0);
                assert_eq!(cover.hi, 12);
                assert_eq!(cover.senders, ["s", "t"].map(String::from).into());
                marked(2)
            })
        };
        let mut narrower = pin!(next(2, 5, &s));
        let mut wider = pin!(next(0, 12, &t));
        let mut same = pin!(next(0, 10, &s));
        for ask in [narrower.as_mut(), wider.as_mut(), same.as_mut()] {
            assert!(ask.now_or_never().is_none(), "waits for the running pass");
        }
        let other = passes.share(8, 0, 1, &s, |_| async { marked(3) }).await;
        assert_eq!(mark(other), 3, "another group's ask does not wait");
        release.send(()).unwrap();
        assert_eq!(mark(first.await), 1);
        assert_eq!(mark(narrower.await), 2);
        assert_eq!(mark(wider.await), 2);
        assert_eq!(mark(same.await), 2);
        assert_eq!(ran.get(), 1, "one pass for the three that waited");
        assert!(passes.groups.lock().unwrap().is_empty(), "nothing kept");
    }

    /// A pass that fails answers the asks it covered with its failure, without another
    /// pass for each (against a database that is down, each would wait out the pool's
    /// timeout in turn); an ask that arrived while it ran gets a pass of its own.
    #[tokio::test]
    async fn a_failed_pass_answers_the_asks_it_covered() {
        let passes = Passes::default();
        let s = names(&["s"]);
        let (release_first, first_gate) = oneshot::channel::<()>();
        let mut first = pin!(passes.share(7, 0, 10, &s, |_| async move {
            first_gate.await.unwrap();
            marked(1)
        }));
        assert!(first.as_mut().now_or_never().is_none());
        // Two asks wait behind the first pass; the first of them runs the next one, which
        // fails.
        let (release_failing, failing_gate) = oneshot::channel::<()>();
        let mut failing = pin!(passes.share(7, 0, 10, &s, |_| async move {
            failing_gate.await.unwrap();
            Err(sqlx::Error::PoolTimedOut)
        }));
        let mut covered = pin!(passes.share(7, 0, 10, &s, |_| async {
            panic!("an ask the failed pass covered runs no pass of its own")
        }));
        assert!(failing.as_mut().now_or_never().is_none());
        assert!(covered.as_mut().now_or_never().is_none());
        release_first.send(()).unwrap();
        assert_eq!(mark(first.await), 1);
        assert!(failing.as_mut().now_or_never().is_none(), "its pass runs");
        // Arrives while the failing pass runs.
        let mut later = pin!(passes.share(7, 0, 10, &s, |_| async { marked(3) }));
        assert!(later.as_mut().now_or_never().is_none());
        release_failing.send(()).unwrap();
        assert!(matches!(failing.await, Err(sqlx::Error::PoolTimedOut)));
        let Err(shared) = covered.await else {
            panic!("the ask the failed pass covered got positions")
        };
        assert!(
            shared.to_string().contains("receipts pass failed"),
            "{shared}"
        );
        assert_eq!(mark(later.await), 3);
        assert!(passes.groups.lock().unwrap().is_empty());
    }
}
