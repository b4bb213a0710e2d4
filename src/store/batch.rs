//! One master's steps, several at a time.
//!
//! Every step a Redis master is asked (acquire, confirm, renew, release, read) goes through
//! its master's queue. One worker per master sends what the queue holds as one script call
//! (`scripts/batch.lua` runs each step's own script in turn and answers each), waits for
//! the answers, hands each to its step, and sends whatever queued meanwhile. Alone, a step
//! travels at once, by itself; under load, the steps of concurrent requests share one
//! EVALSHA, one socket write and one read, on the master and here, which is what a script
//! call's and a system call's fixed cost was spent on. The batch grows with the load: it is
//! what arrived while the previous batch was on the wire.
//!
//! Order: a step is queued when its call is first polled (no await comes before it), one
//! worker sends the batches one after another, and a batch runs its steps in the order they
//! were queued: so a master sees a lease's steps in the order the engine issued them (a
//! release never overtakes its acquire), as it did when each step was a call of its own.
//! A slow master delays only its own queue: the engine still decides on the others'
//! answers. A step has the master timeout from when it was queued: one whose time is up
//! before its batch leaves is not sent, as a call that timed out before it reached the
//! connection never was, and a batch is given up when its oldest step's time is up. So a
//! master that was down or stalled does not run, when it answers again, steps the engine
//! gave up on. A step whose caller merely stopped listening (a failed grant drops its
//! acquires still in flight) is sent all the same, as a call already on the connection
//! was: every master's counter then moves with every grant, and the failed grant's
//! release, queued after it, undoes it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::{Cmd, Script, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::clock::{self, ClockWatch, Reading};
use super::node::{NodeError, NodeResult};
use crate::model::Traffic;

/// One step for the batch: which step script, with its keys and arguments.
pub(crate) struct Step {
    name: &'static str,
    keys: Cmd,
    args: Cmd,
}

impl Step {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            keys: Cmd::new(),
            args: Cmd::new(),
        }
    }

    pub(crate) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        self.keys.arg(key);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// Which step script it runs.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// How many keys and arguments it carries.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.keys.args_iter().count(), self.args.args_iter().count())
    }

    /// Its argument at `index` (from 0) as text.
    #[cfg(test)]
    pub(crate) fn arg_text(&self, index: usize) -> Option<String> {
        match self.args.args_iter().nth(index)? {
            redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).ok(),
            _ => None,
        }
    }

    /// The step as a call of `script` of its own, outside the batches: how the upkeep
    /// scripts (restore, unmark, list, watermark, clocks) run.
    pub(crate) fn invocation<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in self.keys.args_iter() {
            if let redis::Arg::Simple(bytes) = key {
                invocation.key(bytes);
            }
        }
        for arg in self.args.args_iter() {
            if let redis::Arg::Simple(bytes) = arg {
                invocation.arg(bytes);
            }
        }
        invocation
    }

    /// The step as one `EVALSHA` of `script`, its keys and arguments as they are.
    pub(crate) fn evalsha(&self, script: &Script) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(self.keys.args_iter().count());
        for part in self.keys.args_iter().chain(self.args.args_iter()) {
            if let redis::Arg::Simple(bytes) = part {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    /// The step as one `EVALSHA` of `script` in `pipe`, its answer ignored.
    pub(crate) fn pipe_to(&self, pipe: &mut redis::Pipeline, script: &Script) {
        pipe.add_command(self.evalsha(script)).ignore();
    }

    /// The step's first key: on a cluster, its slot is the step's.
    pub(crate) fn first_key(&self) -> Option<&str> {
        match self.keys.args_iter().next()? {
            redis::Arg::Simple(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }
}

/// A queued step and where its answer goes.
struct Queued {
    step: Step,
    reply: oneshot::Sender<NodeResult<Value>>,
    /// The master timeout from when the step was queued: past it, the engine has given up.
    deadline: Instant,
}

/// The queue of one master's steps and the worker that sends them.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Queued>,
    /// The worker's half until the first step starts it: a node is built before (and
    /// outside) the runtime that uses it, and a worker lives in that runtime.
    idle: Mutex<Option<Worker>>,
    started: OnceLock<()>,
    /// How long a step may wait and be answered (the master timeout).
    timeout: Duration,
    /// With batches of one step, each step is sent at once as a call of its own, pipelined
    /// on the connection with the others, as before batching (`REDLOCKD_MASTER_BATCH_MAX=1`:
    /// what batching buys is measured against it).
    direct: Option<Wire>,
    counts: Arc<Counts>,
    clock: Arc<ClockWatch>,
}

/// Steps sent and the calls that carried them, counted as they leave.
#[derive(Default)]
struct Counts {
    steps: AtomicU64,
    calls: AtomicU64,
}

impl Counts {
    fn sent(&self, steps: usize) {
        self.steps.fetch_add(steps as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// How a batch reaches the master: its connection, the script, how errors are named, and
/// the watch on the master's clock that every batch's answer is read by.
#[derive(Clone)]
struct Wire {
    conn: ConnectionManager,
    script: &'static Script,
    classify: fn(redis::RedisError) -> NodeError,
    clock: Arc<ClockWatch>,
}

/// How a master's batches are sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How long a step may wait and be answered (the master timeout).
    pub timeout: Duration,
    /// The most steps one call carries: a batch's script runs to its end before the master
    /// serves anyone else, so it is kept short (a step takes Redis about 7 µs here: 256
    /// of them about 2 ms).
    pub max_steps: usize,
}

/// The task that sends one master's batches, one after another.
struct Worker {
    queue: mpsc::UnboundedReceiver<Queued>,
    wire: Wire,
    max_steps: usize,
    counts: Arc<Counts>,
}

impl Batcher {
    /// A queue whose batches run `script` (the step scripts and `batch.lua`) on `conn`,
    /// within `limits`; `classify` names a failed call's error, `clock` judges the master's
    /// `TIME` each answer ends with.
    pub(crate) fn new(
        conn: ConnectionManager,
        script: &'static Script,
        classify: fn(redis::RedisError) -> NodeError,
        limits: Limits,
        clock: Arc<ClockWatch>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let wire = Wire {
            conn,
            script,
            classify,
            clock: clock.clone(),
        };
        let counts = Arc::new(Counts::default());
        Self {
            queue: tx,
            direct: (limits.max_steps <= 1).then(|| wire.clone()),
            counts: counts.clone(),
            idle: Mutex::new(Some(Worker {
                queue: rx,
                wire,
                max_steps: limits.max_steps.max(1),
                counts,
            })),
            started: OnceLock::new(),
            timeout: limits.timeout,
            clock,
        }
    }

    /// Queue `step` now (not when the answer is first awaited: that is what keeps the
    /// order) and answer what the master answered for it.
    pub(crate) fn send(&self, step: Step) -> BoxFuture<'static, NodeResult<Value>> {
        // A master whose clock jumped is not asked at all until it is quarantined: its
        // answers would not count, and its counter would rise for nothing.
        if let Some(refused) = self.clock.refusal() {
            return Box::pin(std::future::ready(Err(refused)));
        }
        if let Some(wire) = &self.direct {
            let (mut wire, call) = (wire.clone(), pack(wire.script, [&step]));
            self.counts.sent(1);
            return Box::pin(async move {
                let [answer] = <[Value; 1]>::try_from(wire.call(&call, 1).await?)
                    .map_err(|_| NodeError::Script("one step, one answer".into()))?;
                answer_of(answer)
            });
        }
        self.started.get_or_init(|| {
            // Taken once, under the `OnceLock`; a poisoned lock cannot hold a worker anyone
            // else could take, so its contents are used as they are.
            let worker = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(worker) = worker {
                tokio::spawn(worker.run());
            }
        });
        let (tx, rx) = oneshot::channel();
        let deadline = Instant::now() + self.timeout;
        let queued = self.queue.send(Queued {
            step,
            reply: tx,
            deadline,
        });
        Box::pin(async move {
            if queued.is_err() {
                return Err(NodeError::Other("the master's queue has stopped".into()));
            }
            rx.await
                .unwrap_or_else(|_| Err(NodeError::Other("the master's queue has stopped".into())))
        })
    }
}

impl Batcher {
    /// The steps sent so far, and the calls that carried them.
    pub(crate) fn traffic(&self) -> Traffic {
        Traffic {
            steps: self.counts.steps.load(Ordering::Relaxed),
            calls: self.counts.calls.load(Ordering::Relaxed),
        }
    }
}

impl Worker {
    /// Until every sender is gone (the node was dropped): take what is queued, send it as
    /// one call, answer each step.
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(self.max_steps);
        while self.queue.recv_many(&mut batch, self.max_steps).await > 0 {
            let now = Instant::now();
            batch.retain(|queued| queued.deadline > now);
            let Some(deadline) = batch.iter().map(|queued| queued.deadline).min() else {
                continue;
            };
            let call = pack(self.wire.script, batch.iter().map(|q| &q.step));
            self.counts.sent(batch.len());
            let answers = tokio::time::timeout_at(deadline, self.wire.call(&call, batch.len()))
                .await
                .unwrap_or(Err(NodeError::Timeout));
            match answers {
                Ok(answers) => {
                    for (queued, answer) in batch.drain(..).zip(answers) {
                        let _ = queued.reply.send(answer_of(answer));
                    }
                }
                Err(e) => {
                    for queued in batch.drain(..) {
                        let _ = queued.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

/// The answer of a batch of one step (sent by itself), its clock already judged.
pub(crate) fn single_answer(answers: Vec<Value>) -> NodeResult<Value> {
    match <[Value; 1]>::try_from(answers) {
        Ok([answer]) => answer_of(answer),
        Err(other) => Err(NodeError::Script(format!(
            "a batch of one step was answered {other:?}"
        ))),
    }
}

/// A step's answer: an error in its place is that step's script failing, or refusing a
/// master whose data layout this release does not know (`layout.lua`).
fn answer_of(answer: Value) -> NodeResult<Value> {
    match answer {
        Value::ServerError(e) if e.code() == "LAYOUT" => Err(NodeError::Layout(
            e.details().unwrap_or("an unknown data layout").to_owned(),
        )),
        Value::ServerError(e) => Err(NodeError::Script(e.to_string())),
        value => Ok(value),
    }
}

impl Wire {
    /// One EVALSHA of the batch (the script is loaded and the call repeated when the master
    /// does not know it, e.g. after a restart): one answer per step, once the master's
    /// clock, read with them, shows they may count.
    async fn call(&mut self, call: &Cmd, steps: usize) -> NodeResult<Vec<Value>> {
        let sent = Instant::now();
        let mut reply = send_batch(&mut self.conn, call).await;
        if let Err(e) = &reply
            && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            self.script
                .prepare_invoke()
                .load_async(&mut self.conn)
                .await
                .map_err(self.classify)?;
            reply = send_batch(&mut self.conn, call).await;
        }
        let reply = reply.map_err(self.classify)?;
        let received = Instant::now();
        let (answers, master_us) = split_time(reply, steps)?;
        self.clock.observe(Reading {
            sent,
            received,
            master_us,
            local_us: clock::wall_us(),
        })?;
        Ok(answers)
    }
}

/// Send a batch's `call` on `conn` and take its reply as the master gave it: an error in a
/// step's place stays in that place, and only an error in place of the whole reply
/// (`NOSCRIPT`, say) is the call's. redis-rs' `query_async` turns an error anywhere in a
/// reply into the call's, which would fail every step of a batch for one step's error.
pub(crate) async fn send_batch(
    conn: &mut impl redis::aio::ConnectionLike,
    call: &Cmd,
) -> redis::RedisResult<Value> {
    match conn.req_packed_command(call).await? {
        Value::ServerError(e) => Err(e.into()),
        value => Ok(value),
    }
}

/// A batch's answers and the master's clock they end with (`batch.lua`), in microseconds.
pub(crate) fn split_time(reply: Value, steps: usize) -> NodeResult<(Vec<Value>, i64)> {
    match reply {
        Value::Array(mut answers) if answers.len() == steps + 1 => {
            let time = answers.pop().unwrap_or(Value::Nil);
            let master_us = clock::parse_time(&time).ok_or_else(|| {
                NodeError::Script(format!(
                    "a batch ended with {time:?}, not the master's TIME"
                ))
            })?;
            Ok((answers, master_us))
        }
        other => Err(NodeError::Script(format!(
            "a batch of {steps} steps was answered {other:?}"
        ))),
    }
}

/// The EVALSHA of `batch`: every step's keys, then for each step its name, its counts and
/// its arguments (the layout `batch.lua` reads).
pub(crate) fn pack<'a>(script: &Script, batch: impl IntoIterator<Item = &'a Step> + Clone) -> Cmd {
    let keys: usize = batch
        .clone()
        .into_iter()
        .map(|s| s.keys.args_iter().count())
        .sum();
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash()).arg(keys);
    for step in batch.clone() {
        for key in step.keys.args_iter() {
            if let redis::Arg::Simple(bytes) = key {
                call.arg(bytes);
            }
        }
    }
    for step in batch {
        call.arg(step.name)
            .arg(step.keys.args_iter().count())
            .arg(step.args.args_iter().count());
        for arg in step.args.args_iter() {
            if let redis::Arg::Simple(bytes) = arg {
                call.arg(bytes);
            }
        }
    }
    call
}

/// The script a batch runs: each step's own script as a function of its keys and
/// arguments, then `batch.lua`, which deals them out.
pub(crate) fn compose(steps: &[(&str, &str)], dispatch: &str) -> String {
    definitions(steps) + dispatch
}

/// The script of one step sent as a call of its own (`single.lua`, a cluster's steps):
/// `layout.lua`, `prelude.lua`, the step's own script as the function `step`, and nothing of
/// the other steps.
pub(crate) fn single(body: &str) -> String {
    let mut script = String::from(include_str!("scripts/layout.lua"));
    script.push_str(include_str!("scripts/prelude.lua"));
    script.push_str(&format!("local function step(KEYS, ARGV)\n{body}\nend\n"));
    script.push_str(include_str!("scripts/single.lua"));
    script
}

/// What `compose` puts before the dispatch: `layout.lua`, `prelude.lua` and the step
/// functions (defined anew by every call of the script: one closure each, measured as
/// noise beside a step's work).
pub(crate) fn definitions(steps: &[(&str, &str)]) -> String {
    let mut definitions = String::from("local steps = {}\n");
    definitions.push_str(include_str!("scripts/layout.lua"));
    definitions.push_str(include_str!("scripts/prelude.lua"));
    for (name, body) in steps {
        definitions.push_str(&format!(
            "steps['{name}'] = function(KEYS, ARGV)\n{body}\nend\n"
        ));
    }
    definitions
}
