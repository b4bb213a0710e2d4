/**
 * redlockd client for Node ≥ 20: distributed locks with auto-renew, an `AbortSignal`
 * aborted when the lease is lost, fencing tokens, and grants that are safe to retry.
 * No runtime dependencies: the built-in `fetch`.
 *
 * ```ts
 * const client = new Client({ servers: ["http://127.0.0.1:8080"] });
 * await using lease = await client.lock("nightly-report", { ttlMs: 30_000 });
 * lease.ensureValid();                        // throws LeaseLost once it is gone
 * await sendReport({ fence: lease.fencingToken, signal: lease.signal });
 * ```
 */

import { randomUUID } from "node:crypto";

/** Base of every error this client throws. `code` is the contract's error code (or
 * `network` when no server answered), `status` the HTTP status (0 without one). */
export class RedlockdError extends Error {
  constructor(
    message: string,
    readonly code: string = "",
    readonly status: number = 0,
    readonly body: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** Another lease holds the lock (after `waitMs`, if any). */
export class LockHeld extends RedlockdError {
  /** When the holder's lease lapses unless renewed. */
  get retryAfterMs(): number {
    return Number(this.body.retry_after_ms ?? 0);
  }
}

/** No replica could reach a majority of masters, or none answered: the lock's state is
 * unknown. Not "held": try later. */
export class Unavailable extends RedlockdError {}

/** The lease protects nothing any more: revoked, expired, or its validity ran out before
 * a renew succeeded. Stop the protected work. */
export class LeaseLost extends RedlockdError {}

/** The request is wrong (a bad name or TTL, an Idempotency-Key reused for another
 * request): retrying it as is will not help. */
export class BadRequest extends RedlockdError {}

/** No token, or an unknown one (401); or, as `Forbidden`, one not allowed to do this
 * (403). */
export class Unauthorized extends RedlockdError {}

/** The token is known, but its role or name prefixes do not allow this (403). An
 * `Unauthorized` too, so `instanceof Unauthorized` catches both. */
export class Forbidden extends Unauthorized {}

/** Past a server cap or the token's rate (429). */
export class TooManyRequests extends RedlockdError {
  constructor(
    message: string,
    code: string,
    status: number,
    body: Record<string, unknown>,
    readonly retryAfterMs: number,
  ) {
    super(message, code, status, body);
  }
}

/** The typed error an answer that is not a success stands for (the table every client
 * shares: clients/cases/errors.json).
 * @internal */
export function errorFrom(status: number, body: Record<string, unknown>, headers?: Headers): RedlockdError {
  const code = typeof body.error === "string" ? body.error : "";
  const text = `${code ? code + ": " : ""}${typeof body.message === "string" ? body.message : `HTTP ${status}`}`;
  if (status === 409) return new LockHeld(text, code, status, body);
  if (status === 404 && (code === "lease_not_found" || code === "session_not_found")) {
    return new LeaseLost(text, code, status, body);
  }
  if (status === 401) return new Unauthorized(text, code, status, body);
  if (status === 403) return new Forbidden(text, code, status, body);
  if (status === 429) {
    const after = Number(headers?.get("retry-after") ?? "1");
    return new TooManyRequests(text, code, status, body, (Number.isFinite(after) ? after : 1) * 1000);
  }
  // 408: the body did not reach the server in time; another try (or replica) may.
  if (status === 408 || status === 503) return new Unavailable(text, code, status, body);
  if (status >= 400 && status < 500) return new BadRequest(text, code, status, body);
  return new Unavailable(text, code || "server_error", status, body);
}

export interface ClientOptions {
  /** One or more replicas' base URLs (an array, or separated by commas or spaces). */
  servers: string | string[];
  /** A bearer token, when the servers require one. */
  token?: string;
  /** How long one request may take, besides a grant's own `waitMs`. Default 5000. */
  timeoutMs?: number;
  /** The caller's trace, for each request: a W3C `traceparent` (or undefined for none),
   * e.g. from OpenTelemetry's `propagation.inject`. redlockd's spans then join it. */
  traceparent?: () => string | undefined;
  /** Called once when the renews of a lease or session this client renews have not got
   * through and less than a third of its TTL is left (it is then `inJeopardy`): stop what
   * it guards unless `onSafe` comes first, when a renew gets through again. */
  onJeopardy?: (held: Lease | Session, leftMs: number) => void;
  onSafe?: (held: Lease | Session) => void;
}

export interface LockOptions {
  /** Default 30000. */
  ttlMs?: number;
  /** How long to wait while another lease holds the lock. Default 0. */
  waitMs?: number;
  /** Shown by inspect; an election's value. */
  owner?: string;
  /** Renew in the background at a third of the TTL. Default true. */
  autoRenew?: boolean;
  /** Called once when the lease is lost (after `signal` is aborted). */
  onLost?: (lease: Lease) => void;
  /** Sent with the grant and with each retry of it. Default: a random UUID. */
  idempotencyKey?: string;
  /** Give up the grant (a waiting one, say) when this aborts: the call rejects with the
   * signal's reason, and a lease the server may have granted meanwhile is released. */
  signal?: AbortSignal;
  /** A lock's mode: `"shared"` holds it together with other shared holders (an exclusive
   * grant waits for them all). Default `"exclusive"`. */
  mode?: "exclusive" | "shared";
  /** A lock's lock-delay: when the lease ends other than by its release (it expires, or
   * is force-released), nobody gets the name until this many ms after. Default 0. */
  lockDelayMs?: number;
}

/** Options of a session. */
export interface SessionOptions {
  /** Default 30000: every hold through the session lives this long unless renewed. */
  ttlMs?: number;
  owner?: string;
  /** Called once when the session is lost (its holds are lost with it). */
  onLost?: (session: Session) => void;
}

/** Options of a call that only reads. */
export interface CallOptions {
  /** Give up when this aborts: the call rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** A lock's state as inspect answers it; it never names a lease id. */
export interface LockStatus {
  name: string;
  held: boolean;
  /** How it is held, when held. */
  mode?: "exclusive" | "shared";
  /** A shared lock's holders. */
  holders?: { fencingToken: number; ttlRemainingMs: number; owner?: string }[];
  /** The holder's token, when held. */
  fencingToken?: number;
  /** What is left of the holder's lease, when held. */
  ttlRemainingMs?: number;
  owner?: string;
}

/** One permit of a semaphore as inspect answers it; never a lease id. */
export interface PermitHolder {
  slot: number;
  fencingToken: number;
  ttlRemainingMs: number;
  owner?: string;
}

/** A semaphore's permits held now, by slot. */
export interface SemaphoreStatus {
  name: string;
  holders: PermitHolder[];
}

export interface Leader {
  name: string;
  term: number;
  value?: string;
  ttlRemainingMs: number;
}

/** `elected` (a new term), `proclaimed` (the leader's new value, same term) or `vacant`
 * (`term` is the last leader's, if known). */
export interface LeaderEvent {
  kind: "elected" | "proclaimed" | "vacant";
  name: string;
  term?: number;
  value?: string;
}

type Kind = "locks" | "elections" | "semaphores";
type Json = Record<string, unknown>;

/** Grants, renews and releases are tried on each server in turn, this many rounds at most. */
const ROUNDS = 2;

function path(kind: Kind, name: string, leaseId?: string): string {
  const p = `/${kind}/${encodeURIComponent(name)}`;
  return leaseId === undefined ? p : `${p}/leases/${encodeURIComponent(leaseId)}`;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A wait of `ms` spread evenly over its second half: clients that failed together (a
 * replica restarted under all of them) do not all retry in the same instant. */
export const jittered = (ms: number): number => ms / 2 + (Math.random() * ms) / 2;

/** A redlockd client over one or more replicas, failing over between them. */
export class Client {
  readonly servers: string[];
  readonly token?: string;
  readonly timeoutMs: number;
  private readonly traceparent?: () => string | undefined;
  private preferred = 0;
  /** @internal */
  readonly onJeopardy?: ClientOptions["onJeopardy"];
  /** @internal */
  readonly onSafe?: ClientOptions["onSafe"];

  constructor(options: ClientOptions) {
    const servers = typeof options.servers === "string" ? options.servers.split(/[\s,]+/) : options.servers;
    this.servers = servers.filter((s) => s).map((s) => s.replace(/\/+$/, ""));
    if (this.servers.length === 0) throw new TypeError("at least one server URL is required");
    this.token = options.token;
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.traceparent = options.traceparent;
    this.onJeopardy = options.onJeopardy;
    this.onSafe = options.onSafe;
  }

  /** Grant `name`, waiting up to `waitMs` while another holds it. Throws `LockHeld`,
   * `Unavailable`, `BadRequest`, `Unauthorized`. The grant carries an Idempotency-Key, so
   * that a retry after a lost answer gets the same lease. */
  async lock(name: string, options: LockOptions = {}): Promise<Lease> {
    return this.grant("locks", name, options);
  }

  /** Every one of `names` under one lease, or none (in any order: the server orders them,
   * so two callers never deadlock); renewed, signalled and released as one lock's lease,
   * whose `names` lists them. Throws `LockHeld` while any is held past `waitMs`. */
  async lockMany(names: string[], options: LockOptions = {}): Promise<Lease> {
    return this.grant("locks", "", options, undefined, names);
  }

  /** One of `limit` permits of semaphore `name`, renewed and signalled like a lock's
   * lease; `slot` says which of the `limit` slots it holds, and its `fencingToken` rises
   * per slot. Throws `LockHeld` when all are taken for the whole `waitMs`. */
  async permit(name: string, limit: number, options: LockOptions = {}): Promise<Lease> {
    return this.grant("semaphores", name, options, limit);
  }

  /** Open a session: one heartbeat (at a third of `ttlMs`) for every lock, permit and
   * term taken through it (`session.lock(...)`), which need no renew of their own.
   * `await using` ends it, releasing them all at once. */
  async session(options: SessionOptions = {}): Promise<Session> {
    const body: Json = { ttl_ms: options.ttlMs ?? 30_000 };
    if (options.owner !== undefined) body.owner = options.owner;
    const sent = performance.now();
    const answer = await this.call("POST", "/sessions", { body });
    return new Session(this, answer, sent, options);
  }

  /** The permits of semaphore `name` held now, by slot. */
  async semaphore(name: string, options: CallOptions = {}): Promise<SemaphoreStatus> {
    const body = await this.call("GET", path("semaphores", name), { signal: options.signal });
    const holders = Array.isArray(body.holders) ? (body.holders as Json[]) : [];
    return {
      name: String(body.name),
      holders: holders.map((h) => ({
        slot: Number(h.slot),
        fencingToken: Number(h.fencing_token),
        ttlRemainingMs: Number(h.ttl_remaining_ms),
        owner: h.owner as string | undefined,
      })),
    };
  }

  /** Become leader of election `name`; the lease's `term` is its fencing token, and
   * `proclaim(value)` publishes a new value. */
  async campaign(name: string, value?: string, options: Omit<LockOptions, "owner"> = {}): Promise<Lease> {
    return this.grant("elections", name, { ttlMs: 10_000, ...options, owner: value });
  }

  /** Who leads `name` now, or null when vacant. */
  async leader(name: string, options: CallOptions = {}): Promise<Leader | null> {
    const body = await this.call("GET", path("elections", name), { signal: options.signal });
    if (body.vacant) return null;
    return {
      name: String(body.name),
      term: Number(body.term),
      value: body.value as string | undefined,
      ttlRemainingMs: Number(body.ttl_remaining_ms ?? 0),
    };
  }

  /** Every change of `name`'s leadership, starting with the current state, until `signal`
   * aborts or the caller stops iterating; reconnects (to another replica if need be) when
   * a stream ends, and is told the current state again then. */
  async *observe(name: string, signal?: AbortSignal): AsyncGenerator<LeaderEvent> {
    let failures = 0;
    while (!signal?.aborted) {
      for (const url of this.order()) {
        if (signal?.aborted) return;
        try {
          const resp = await fetch(`${url}${path("elections", name)}/observe`, {
            headers: this.headers(),
            signal,
          });
          if (!resp.ok || !resp.body) throw errorFrom(resp.status, await readJson(resp), resp.headers);
          this.answered(url);
          failures = 0;
          for await (const [event, data] of sse(resp.body)) {
            // The replica is stopping and the stream ends: reconnect, to another if need be.
            if (event === "closed") continue;
            yield {
              kind: event as LeaderEvent["kind"],
              name: String(data.name ?? name),
              term: data.term as number | undefined,
              value: data.value as string | undefined,
            };
          }
        } catch (e) {
          if (signal?.aborted) return;
          if (e instanceof RedlockdError && !(e instanceof Unavailable)) throw e;
          failures++;
        }
      }
      await sleep(jittered(Math.min(2000, 50 * 2 ** Math.min(failures, 6))));
    }
  }

  /** Who holds lock `name`, if anyone. */
  async inspect(name: string, options: CallOptions = {}): Promise<LockStatus> {
    const body = await this.call("GET", path("locks", name), { signal: options.signal });
    return {
      name: String(body.name),
      held: body.held === true,
      fencingToken: body.fencing_token === undefined ? undefined : Number(body.fencing_token),
      ttlRemainingMs: body.ttl_remaining_ms === undefined ? undefined : Number(body.ttl_remaining_ms),
      owner: body.owner as string | undefined,
      mode: body.mode as LockStatus["mode"],
      holders: Array.isArray(body.holders)
        ? (body.holders as Json[]).map((h) => ({
            fencingToken: Number(h.fencing_token),
            ttlRemainingMs: Number(h.ttl_remaining_ms),
            owner: h.owner as string | undefined,
          }))
        : undefined,
    };
  }

  /** Run `fn` on this instance only if no other runs it this tick: take `name` without
   * waiting, run `fn(lease)`, and keep the lock `holdAtLeastMs` after the grant, so that
   * instances whose clocks fire a little later find it held. `ran` is false when another
   * instance had it. */
  async runOncePerTick<T>(
    name: string,
    fn: (lease: Lease) => Promise<T> | T,
    options: { holdAtLeastMs: number; ttlMs?: number; signal?: AbortSignal },
  ): Promise<{ ran: boolean; value?: T }> {
    let lease: Lease;
    try {
      lease = await this.lock(name, {
        ttlMs: options.ttlMs ?? Math.max(options.holdAtLeastMs * 2, 1000),
        signal: options.signal,
      });
    } catch (e) {
      if (e instanceof LockHeld) return { ran: false };
      throw e;
    }
    const granted = performance.now();
    try {
      const value = await fn(lease);
      const left = options.holdAtLeastMs - (performance.now() - granted);
      if (left > 0 && !lease.signal.aborted) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left);
          lease.signal.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
        });
      }
      return { ran: true, value };
    } finally {
      await lease[Symbol.asyncDispose]();
    }
  }

  /** @internal */
  async grant(
    kind: Kind,
    name: string,
    options: LockOptions,
    limit?: number,
    names?: string[],
    session?: string,
  ): Promise<Lease> {
    const waitMs = options.waitMs ?? 0;
    const body: Json = { ttl_ms: options.ttlMs ?? 30_000, wait_ms: waitMs };
    if (session !== undefined) {
      // A hold through a session lives as long as the session: no TTL of its own.
      delete body.ttl_ms;
      body.session = session;
    }
    if (options.lockDelayMs) body.lock_delay_ms = options.lockDelayMs;
    if (limit !== undefined) body.limit = limit;
    if (options.mode === "shared") body.mode = "shared";
    if (names !== undefined) body.names = names;
    const grantPath = names === undefined ? path(kind, name) : "/locks";
    if (options.owner !== undefined) body[kind === "elections" ? "value" : "owner"] = options.owner;
    const sent = performance.now();
    const idempotencyKey = options.idempotencyKey ?? randomUUID();
    let answer: Json;
    try {
      answer = await this.call("POST", grantPath, {
        body,
        idempotencyKey,
        timeoutMs: this.timeoutMs + waitMs,
        signal: options.signal,
      });
    } catch (e) {
      if (options.signal?.aborted) {
        // The server may still be waiting on the grant's behalf until its wait ends.
        const waitLeft = Math.max(0, sent + waitMs - performance.now());
        this.abandon(grantPath, body, idempotencyKey, waitLeft);
      }
      throw e;
    }
    return new Lease(this, kind, answer, sent, options);
  }

  /** A grant given up by its caller may still be won: the server keeps a keyed grant
   * whose client left for a retry, and goes on waiting for it until its `wait_ms` ends.
   * Once that wait is over, ask once more with the same key, not waiting, and release
   * what it answers, in the background (a process that exits first leaves the lease to
   * expire at its TTL). */
  private abandon(grantPath: string, body: Json, idempotencyKey: string, afterMs: number): void {
    const ask = { ...body, wait_ms: 0 };
    setTimeout(() => {
      void this.call("POST", grantPath, { body: ask, idempotencyKey })
        .then((won) => {
          // A lease on several names is released through its first name.
          const held = grantPath === "/locks" ? path("locks", String(won.name)) : grantPath;
          return this.call("DELETE", `${held}/leases/${encodeURIComponent(String(won.lease_id))}`);
        })
        .catch(() => undefined);
    }, afterMs + 50).unref();
  }

  /** One request, tried on each replica in turn while none answers or a replica cannot
   * reach a majority (503). Only requests that are safe to repeat come here: renews and
   * releases name their lease, and grants carry an Idempotency-Key.
   * @internal */
  async call(
    method: string,
    route: string,
    options: {
      body?: Json;
      idempotencyKey?: string;
      timeoutMs?: number;
      signal?: AbortSignal;
      /** When the whole call gives up (`performance.now()` ms), whichever replica it asks. */
      deadline?: number;
    } = {},
  ): Promise<Json> {
    let last: RedlockdError | undefined;
    for (let round = 0; round < ROUNDS; round++) {
      for (const url of this.order()) {
        let eachMs = options.timeoutMs ?? this.timeoutMs;
        if (options.deadline !== undefined) {
          const leftMs = options.deadline - performance.now();
          if (leftMs <= 0 && last) throw last;
          eachMs = Math.min(eachMs, Math.max(leftMs, 10));
        }
        let resp: Response;
        try {
          resp = await fetch(url + route, {
            method,
            headers: this.headers(options.idempotencyKey, options.body !== undefined),
            body: options.body === undefined ? undefined : JSON.stringify(options.body),
            signal: AbortSignal.any([
              AbortSignal.timeout(Math.max(1, Math.ceil(eachMs))),
              ...(options.signal ? [options.signal] : []),
            ]),
          });
        } catch (e) {
          // The caller gave up: no other replica is asked.
          if (options.signal?.aborted) throw options.signal.reason;
          last = new Unavailable(`${url}: ${(e as Error).message}`, "network");
          continue;
        }
        const body = await readJson(resp);
        if (resp.status === 503) {
          last = errorFrom(503, body, resp.headers);
          continue;
        }
        this.answered(url);
        if (resp.status >= 400) throw errorFrom(resp.status, body, resp.headers);
        return body;
      }
    }
    throw last ?? new Unavailable("no server answered", "network");
  }

  private headers(idempotencyKey?: string, json = false): Record<string, string> {
    const h: Record<string, string> = { accept: "application/json" };
    if (json) h["content-type"] = "application/json";
    if (this.token) h.authorization = `Bearer ${this.token}`;
    if (idempotencyKey) h["idempotency-key"] = idempotencyKey;
    const traceparent = this.traceparent?.();
    if (traceparent) h.traceparent = traceparent;
    return h;
  }

  private order(): string[] {
    const n = this.servers.length;
    return Array.from({ length: n }, (_, i) => this.servers[(this.preferred + i) % n]);
  }

  private answered(url: string): void {
    this.preferred = this.servers.indexOf(url);
  }
}

/** How long a renew sent at `now` may wait for its answer: at most `mostMs` (the client's
 * timeout), and no longer than until the next thing the renewer must tell: the jeopardy
 * point while not yet warned, then the end of the validity. A renew that hangs (its
 * replica stopped answering) then fails in time for both. */
function renewTimeoutMs(
  held: { ttlMs: number; validUntil: number; inJeopardy: boolean },
  now: number,
  mostMs: number,
): number {
  const due = held.validUntil - held.ttlMs / 3 - now;
  const untilMs = !held.inJeopardy && due > 0 ? due : held.validUntil - now;
  return Math.max(50, Math.min(mostMs, untilMs));
}

/** What a lease and a session share: renewing in the background at a third of the TTL,
 * a failed renew again every tenth of it while still valid, the warning when renews have
 * not got through and less than a third of the TTL is left (once, until one does), and
 * the loss signalled at the end of the validity at the latest. Its timers do not keep the
 * process alive. */
class Renewer {
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly owner: {
      ttlMs: number;
      validUntil: number;
      inJeopardy: boolean;
      renew(): Promise<void>;
      done(): boolean;
      lose(reason: string): void;
      tell(what: "jeopardy" | "safe", leftMs: number): void;
    },
  ) {}

  start(): void {
    this.schedule(this.owner.ttlMs / 3);
  }

  stop(): void {
    clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    const left = this.owner.validUntil - performance.now();
    this.timer = setTimeout(() => void this.tick(), Math.max(0, Math.min(delayMs, left)));
    this.timer.unref();
  }

  private async tick(): Promise<void> {
    const owner = this.owner;
    if (owner.done()) return;
    let next = owner.ttlMs / 3;
    try {
      await owner.renew();
      if (owner.inJeopardy) {
        owner.inJeopardy = false;
        owner.tell("safe", owner.validUntil - performance.now());
      }
    } catch (e) {
      if (e instanceof LeaseLost) return;
      next = jittered(Math.max(owner.ttlMs / 10, 10));
    }
    if (owner.done()) return;
    const now = performance.now();
    if (now >= owner.validUntil) {
      owner.lose("expired");
      return;
    }
    if (!owner.inJeopardy) {
      const due = owner.validUntil - owner.ttlMs / 3 - now;
      if (due <= 0) {
        owner.inJeopardy = true;
        owner.tell("jeopardy", owner.validUntil - now);
      } else {
        next = Math.min(next, due);
      }
    }
    this.schedule(next);
  }
}

/** A granted lease, renewed in the background at a third of its TTL until released.
 * `signal` is aborted (with a `LeaseLost` reason) when it can no longer be relied on;
 * pass it to the protected work. `await using` releases it on leaving the scope. */
export class Lease implements AsyncDisposable {
  readonly name: string;
  readonly leaseId: string;
  readonly fencingToken: number;
  ttlMs: number;
  owner?: string;
  /** A semaphore's permit: which of its `limit` slots it holds. */
  readonly slot?: number;
  /** A lock's lease: `"exclusive"` or `"shared"`. */
  readonly mode?: "exclusive" | "shared";
  /** A lease on several names: all of them, sorted (empty for one name). */
  readonly names: string[];
  readonly limit?: number;
  /** `performance.now()` until which the lease may be relied on. */
  validUntil: number;
  lostReason?: string;
  /** Renews have not got through and less than a third of the TTL is left (the client's
   * `onJeopardy`); false again once one does (`onSafe`). */
  inJeopardy = false;
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private readonly renewer = new Renewer(this);
  /** @internal */
  released = false;
  /** @internal `performance.now()` when a session took this hold: a session renew sent
   * before then does not judge it. */
  joinedAt = performance.now();

  /** @internal */
  constructor(
    private readonly client: Client,
    readonly kind: Kind,
    body: Json,
    sent: number,
    private readonly options: LockOptions,
  ) {
    this.name = String(body.name);
    this.leaseId = String(body.lease_id);
    this.fencingToken = Number(body.fencing_token ?? body.term);
    this.ttlMs = Number(body.ttl_ms);
    this.owner = (kind === "elections" ? body.value : body.owner) as string | undefined;
    this.validUntil = sent + Number(body.validity_ms);
    this.slot = body.slot === undefined ? undefined : Number(body.slot);
    this.limit = body.limit === undefined ? undefined : Number(body.limit);
    this.mode = body.mode as Lease["mode"];
    this.names = Array.isArray(body.names) ? (body.names as string[]) : [];
    this.signal = this.controller.signal;
    if (options.autoRenew !== false) this.renewer.start();
  }

  /** An election's term: its lease's fencing token. */
  get term(): number {
    return this.fencingToken;
  }

  /** Milliseconds this lease may still be relied on (0 once lost). */
  get remainingMs(): number {
    return this.lostReason ? 0 : Math.max(0, this.validUntil - performance.now());
  }

  /** Throw `LeaseLost` unless the lease is valid for `marginMs` more. Call it right
   * before each protected write, and send `fencingToken` with the write. */
  ensureValid(marginMs = 0): void {
    if (this.lostReason) throw new LeaseLost(`lease of ${this.name} lost: ${this.lostReason}`, this.lostReason);
    if (performance.now() + marginMs >= this.validUntil) {
      throw new LeaseLost(`lease of ${this.name} has no validity left`, "expired");
    }
  }

  /** Renew now (the lease does this on its own); `value` proclaims a leader's new value. */
  async renew(options: { ttlMs?: number; value?: string } = {}): Promise<void> {
    const body: Json = {};
    if (options.ttlMs !== undefined) body.ttl_ms = options.ttlMs;
    if (options.value !== undefined) body.value = options.value;
    const sent = performance.now();
    const timeoutMs = renewTimeoutMs(this, sent, this.client.timeoutMs);
    try {
      const answer = await this.client.call("PUT", path(this.kind, this.name, this.leaseId), {
        body,
        timeoutMs,
        deadline: sent + timeoutMs,
      });
      this.validUntil = Math.max(this.validUntil, sent + Number(answer.validity_ms));
      this.ttlMs = Number(answer.ttl_ms);
      const owner = this.kind === "elections" ? answer.value : answer.owner;
      if (typeof owner === "string") this.owner = owner;
    } catch (e) {
      if (e instanceof LeaseLost) this.lose("lease_not_found");
      throw e;
    }
  }

  /** An elected leader's new value, published to observers; the term stays. */
  async proclaim(value: string): Promise<void> {
    await this.renew({ value });
  }

  /** Stop renewing and let go of the lock. A lease already gone is not an error. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.renewer.stop();
    try {
      await this.client.call("DELETE", path(this.kind, this.name, this.leaseId));
    } catch (e) {
      if (!(e instanceof LeaseLost)) throw e;
    }
  }

  /** Release on leaving an `await using` scope. A failed release is not thrown: the lock
   * lapses at its TTL, and the scope's own error must not be hidden. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch {
      // Lapses at its TTL.
    }
  }

  /** @internal */
  tell(what: "jeopardy" | "safe", leftMs: number): void {
    try {
      if (what === "jeopardy") this.client.onJeopardy?.(this, leftMs);
      else this.client.onSafe?.(this);
    } catch {
      // A callback's bug must not break the renewing.
    }
  }

  /** @internal */
  done(): boolean {
    return this.released || this.lostReason !== undefined;
  }

  /** @internal */
  lose(reason: string): void {
    if (this.lostReason || this.released) return;
    this.lostReason = reason;
    this.renewer.stop();
    this.controller.abort(new LeaseLost(`lease of ${this.name} lost: ${reason}`, reason));
    try {
      this.options.onLost?.(this);
    } catch {
      // A callback's bug must not break the lease.
    }
  }
}

/** A session: one heartbeat for many holds. Renewed in the background at a third of its
 * TTL until ended; every lock, permit and term taken through it is valid as long as the
 * session is, and is lost with it. `signal` aborts when the session is lost. `await using`
 * ends it, releasing every hold at once. */
export class Session implements AsyncDisposable {
  readonly sessionId: string;
  ttlMs: number;
  readonly owner?: string;
  /** `performance.now()` until which the session (and its holds) may be relied on. */
  validUntil: number;
  lostReason?: string;
  /** As a lease's: renews failing with less than a third of the TTL left. */
  inJeopardy = false;
  readonly signal: AbortSignal;
  /** The holds taken through this session and not lost. */
  holds: Lease[] = [];
  private readonly controller = new AbortController();
  private readonly renewer: Renewer = new Renewer(this);
  private ended = false;

  /** @internal */
  constructor(
    private readonly client: Client,
    body: Json,
    sent: number,
    private readonly options: SessionOptions,
  ) {
    this.sessionId = String(body.session_id);
    this.ttlMs = Number(body.ttl_ms);
    this.owner = body.owner as string | undefined;
    this.validUntil = sent + Number(body.validity_ms);
    this.signal = this.controller.signal;
    this.renewer.start();
  }

  /** Lock `name` through this session (`ttlMs` and `autoRenew` do not apply). */
  async lock(name: string, options: LockOptions = {}): Promise<Lease> {
    return this.hold(await this.client.grant("locks", name, this.holdOptions(options), undefined, undefined, this.sessionId));
  }

  /** One of `limit` permits of semaphore `name`, through this session. */
  async permit(name: string, limit: number, options: LockOptions = {}): Promise<Lease> {
    return this.hold(await this.client.grant("semaphores", name, this.holdOptions(options), limit, undefined, this.sessionId));
  }

  /** Every one of `names` under one lease, through this session. */
  async lockMany(names: string[], options: LockOptions = {}): Promise<Lease> {
    return this.hold(await this.client.grant("locks", "", this.holdOptions(options), undefined, names, this.sessionId));
  }

  /** Become leader of election `name` through this session. */
  async campaign(name: string, value?: string, options: Omit<LockOptions, "owner"> = {}): Promise<Lease> {
    return this.hold(
      await this.client.grant("elections", name, this.holdOptions({ ...options, owner: value }), undefined, undefined, this.sessionId),
    );
  }

  /** Milliseconds the session may still be relied on (0 once lost). */
  get remainingMs(): number {
    return this.lostReason ? 0 : Math.max(0, this.validUntil - performance.now());
  }

  /** Renew the session, and every hold through it, now (it does this on its own). */
  async renew(): Promise<void> {
    const sent = performance.now();
    const timeoutMs = renewTimeoutMs(this, sent, this.client.timeoutMs);
    let answer: Json;
    try {
      answer = await this.client.call("PUT", `/sessions/${encodeURIComponent(this.sessionId)}`, {
        body: {},
        timeoutMs,
        deadline: sent + timeoutMs,
      });
    } catch (e) {
      if (e instanceof LeaseLost) this.lose("session_not_found");
      throw e;
    }
    this.validUntil = Math.max(this.validUntil, sent + Number(answer.validity_ms));
    this.ttlMs = Number(answer.ttl_ms);
    // Only the holds the answer lists in `kept` are valid as long as the session now; those
    // it lists as `unconfirmed` keep the validity they had (a master that carries them did
    // not answer) and are lost once it runs out; any other hold taken before the renew was
    // sent has ended. A hold granted while the renew was under way is judged by the next.
    const kept = new Set(Array.isArray(answer.kept) ? (answer.kept as string[]) : []);
    const unconfirmed = new Set(Array.isArray(answer.unconfirmed) ? (answer.unconfirmed as string[]) : []);
    const now = performance.now();
    const lost: [Lease, string][] = [];
    for (const hold of this.holds) {
      if (hold.joinedAt > sent) continue;
      if (kept.has(hold.leaseId)) hold.validUntil = Math.max(hold.validUntil, this.validUntil);
      else if (!unconfirmed.has(hold.leaseId)) lost.push([hold, "lease_not_found"]);
      else if (hold.validUntil <= now) lost.push([hold, "quorum_lost"]);
    }
    this.holds = this.holds.filter((h) => !lost.some(([l]) => l === h));
    for (const [hold, reason] of lost) hold.lose(reason);
  }

  /** The session as the server reads it, with `holds`. */
  async info(options: CallOptions = {}): Promise<Json> {
    return this.client.call("GET", `/sessions/${encodeURIComponent(this.sessionId)}`, { signal: options.signal });
  }

  /** End the session: every hold through it is released. A session already gone is not
   * an error. */
  async end(): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    this.renewer.stop();
    for (const hold of this.holds) hold.released = true;
    try {
      await this.client.call("DELETE", `/sessions/${encodeURIComponent(this.sessionId)}`);
    } catch (e) {
      if (!(e instanceof LeaseLost)) throw e;
    }
  }

  /** End on leaving an `await using` scope (a failed end is not thrown: the session
   * lapses at its TTL). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.end();
    } catch {
      // Lapses at its TTL.
    }
  }

  private holdOptions(options: LockOptions): LockOptions {
    return { ...options, autoRenew: false };
  }

  private hold(lease: Lease): Lease {
    lease.joinedAt = performance.now();
    this.holds.push(lease);
    return lease;
  }

  /** @internal */
  tell(what: "jeopardy" | "safe", leftMs: number): void {
    try {
      if (what === "jeopardy") this.client.onJeopardy?.(this, leftMs);
      else this.client.onSafe?.(this);
    } catch {
      // A callback's bug must not break the renewing.
    }
  }

  /** @internal */
  done(): boolean {
    return this.ended || this.lostReason !== undefined;
  }

  /** @internal */
  lose(reason: string): void {
    if (this.lostReason || this.ended) return;
    this.lostReason = reason;
    this.renewer.stop();
    for (const hold of this.holds) hold.lose(reason);
    this.controller.abort(new LeaseLost(`session lost: ${reason}`, reason));
    try {
      this.options.onLost?.(this);
    } catch {
      // A callback's bug must not break the session.
    }
  }
}

async function readJson(resp: Response): Promise<Json> {
  try {
    const text = await resp.text();
    return text ? (JSON.parse(text) as Json) : {};
  } catch {
    return {};
  }
}

/** Server-sent events as [event, JSON data] pairs (the table every client shares:
 * clients/cases/sse.json).
 * @internal */
export async function* sse(body: ReadableStream<Uint8Array>): AsyncGenerator<[string, Json]> {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data: string[] = [];
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).replace(/\r$/, "");
      buffer = buffer.slice(newline + 1);
      if (line === "") {
        if (data.length) {
          try {
            yield [event, JSON.parse(data.join("\n")) as Json];
          } catch {
            // Not JSON: not one of ours.
          }
        }
        event = "message";
        data = [];
      } else if (line.startsWith("event:")) {
        event = line.slice(6).trim();
      } else if (line.startsWith("data:")) {
        data.push(line.slice(5).trimStart());
      }
    }
  }
}
