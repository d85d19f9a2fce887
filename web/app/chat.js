// The chat view: one conversation's history (the latest 50, older ones on scrolling up),
// the composer, typing, receipts and recall. Messages come from the SDK's `message` events
// (every conversation, once, in seq order) and from history pages; both land in one cache
// keyed by seq, so a message is never shown twice.

import { newClientMsgId } from "/web/vendor/courier-client/index.js";
import { $, describe, fill, h, time } from "./dom.js";
import { KIND, callLine, isBundled, isTip, renderBody } from "./kinds.js";

const PAGE = 50;
/** Messages kept per conversation that is not on screen. */
const KEEP = 300;
/** Messages on screen at most while the reader is at the bottom (scrolling up brings back the rest). */
const SHOWN = 500;
/** Conversations whose messages this page keeps (the least recently opened go first). */
const CHATS = 20;
/** Waits before asking again for previews that failed; then they show as unavailable. */
const PREVIEW_RETRIES_MS = [1000, 2000, 4000];
const TYPING_SHOWN_MS = 6000;
const TYPING_EVERY_MS = 3000;
const GROUP_RECEIPTS_EVERY_MS = 10000;

export class ChatView {
  constructor({ client, state, title, onOpen }) {
    this.client = client;
    this.state = state;
    this.title = title;
    this.onOpen = onOpen;
    /** conversationId → Map(seq → message). */
    this.cache = new Map();
    /** `{conversationId?, conversationType, peerId?}`; a private chat without an id is a draft. */
    this.current = null;
    /** Grows with every open: answers for an older view are dropped. */
    this.generation = 0;
    /** seq → `<li>` of the conversation on screen. */
    this.items = new Map();
    this.hasOlder = false;
    this.loadingOlder = false;
    /** The lowest seq on screen (Infinity: none yet): older cached ones wait for a scroll. */
    this.floor = Infinity;
    /** The peer's positions in the private chat on screen. */
    this.peer = { readSeq: 0, deliveredSeq: 0 };
    /** seq → {read, delivered, of} in the group on screen. */
    this.groupReceipts = new Map();
    /** clientMsgId → {el, key, conversationId?} of sends not acked yet (or failed). */
    this.pending = new Map();
    /** `conversationId:seq` → clientMsgId: acked, waiting for the message event. */
    this.acked = new Map();
    /** conversationId → Map(userId → until). */
    this.typingUsers = new Map();
    this.receipts = true;
    this.receivedTimers = new Map();
    this.previewWanted = new Map();
    this.previewTimer = null;
    this.lastTypingSent = 0;
    this.receiptsTimer = null;

    $("#composer").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.sendText();
    });
    const text = $("#composer-text");
    text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        void this.sendText();
      }
    });
    text.addEventListener("input", () => this.onInput());
    text.addEventListener("blur", () => this.stopTyping());
    $("#messages").addEventListener("scroll", () => this.onScroll());
    $("#back").addEventListener("click", () => this.close());
    $("#add-member-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.addMember();
    });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") {
        this.markRead();
        this.refreshReceipts();
      }
    });
    setInterval(() => {
      if (this.current?.conversationType === 2 && document.visibilityState === "visible") this.refreshReceipts();
    }, GROUP_RECEIPTS_EVERY_MS);
  }

  get me() {
    return this.state.me;
  }

  // ---- opening and closing

  open(target) {
    this.current = { ...target };
    const generation = ++this.generation;
    this.setBusy(true);
    this.touch(this.current.conversationId);
    this.items.clear();
    this.peer = { readSeq: 0, deliveredSeq: 0 };
    this.groupReceipts.clear();
    this.hasOlder = false;
    this.floor = Infinity;
    /** Scrolling loads older messages only once the latest are in place. */
    this.ready = false;
    fill($("#message-list"));
    fill($("#send-error"));
    $("#chat-empty").hidden = true;
    $("#chat-view").hidden = false;
    document.body.classList.add("in-chat");
    this.refreshHeader();
    this.renderTyping();
    this.onOpen();
    for (const p of this.pending.values()) if (p.key === this.key()) $("#message-list").append(p.el);
    if (this.current.conversationId) {
      this.showLatest();
      void this.loadLatest(generation);
    } else {
      this.historyState(`No messages yet. Say hello to ${this.current.peerId}.`);
      this.setBusy(false);
    }
    $("#composer-text").focus();
  }

  close() {
    this.current = null;
    this.generation++;
    this.setBusy(false);
    $("#chat-view").hidden = true;
    $("#chat-empty").hidden = false;
    document.body.classList.remove("in-chat");
    this.onOpen();
    $("#conversations").querySelector("button")?.focus();
  }

  /** The key of a conversation or a draft, for pending sends. */
  key(target = this.current) {
    return target?.conversationId ? `c${target.conversationId}` : `p${target?.peerId}`;
  }

  /** The send target of the conversation on screen. */
  target() {
    const c = this.current;
    if (!c) return null;
    return c.conversationId
      ? { conversationType: c.conversationType, conversationId: c.conversationId }
      : { conversationType: 1, peerId: c.peerId };
  }

  /** A draft became a conversation (its first message was stored). */
  adopt(conversationId) {
    const c = this.current;
    if (!c || c.conversationId) return;
    const oldKey = this.key();
    c.conversationId = conversationId;
    for (const p of this.pending.values()) if (p.key === oldKey) p.key = this.key();
    this.refreshHeader();
    this.onOpen();
    this.setBusy(true);
    this.showLatest();
    void this.loadLatest(this.generation);
  }

  refreshHeader() {
    const c = this.current;
    if (!c) return;
    const entry = c.conversationId ? this.state.conversations.get(c.conversationId) : null;
    const group = c.conversationId ? this.state.groups.get(c.conversationId) : null;
    const name = entry ? this.title(entry) : c.conversationType === 1 ? c.peerId : (group?.name ?? "Group");
    $("#chat-title").textContent = name;
    const isGroup = c.conversationType !== 1;
    // Our membership as the user stream last said (joined, left, kicked, dissolved), else
    // the overview's.
    const member = group?.memberState ? group.memberState === "member" : entry ? entry.member !== false : true;
    let sub;
    if (!isGroup) sub = this.state.friends.has(c.peerId ?? entry?.peerId) ? "Friend" : "Private chat";
    else if (!member) sub = group?.state === "dissolved" ? "This group was dissolved" : "You are no longer a member";
    else sub = group ? `${group.memberCount} member${group.memberCount === 1 ? "" : "s"}${group.notice ? ` · ${group.notice}` : ""}` : "Group";
    $("#chat-sub").textContent = sub;
    $("#add-member-form").hidden = !(isGroup && member && c.conversationType === 2);
    $("#composer-text").disabled = !member;
    $("#send").disabled = !member;
  }

  // ---- history

  async loadLatest(generation) {
    const id = this.current.conversationId;
    const entry = this.state.conversations.get(id);
    const cached = this.cache.get(id);
    const top = Math.max(entry?.lastSeq ?? 0, maxKey(cached), this.client.seq(id) ?? 0);
    this.historyState("Loading…");
    this.setBusy(true);
    try {
      const page = await this.page(id, { beforeSeq: top + 1, limit: PAGE });
      if (generation !== this.generation) return;
      this.merge(id, page.messages);
      this.showLatest();
      this.hasOlder = page.hasMore || minKey(this.cache.get(id)) < this.floor;
      this.scrollToBottom();
      this.ready = true;
      this.historyState();
      this.markRead();
      this.refreshReceipts();
    } catch (err) {
      if (generation !== this.generation) return;
      this.alert(`Could not load the history: ${describe(err)}`);
      fill($("#history-state"), h("button", { class: "link", onclick: () => this.loadLatest(this.generation) }, "Try again"));
    } finally {
      if (generation === this.generation) this.setBusy(false);
    }
  }

  async loadOlder() {
    const c = this.current;
    if (!c?.conversationId || this.loadingOlder || !this.hasOlder) return;
    const id = c.conversationId;
    const generation = this.generation;
    const floor = this.floor;
    if (!Number.isFinite(floor) || floor <= 1) {
      this.hasOlder = false;
      this.historyState();
      return;
    }
    const box = $("#messages");
    // Older messages this page already holds (pushed or pulled before) come first.
    const cached = sortedSeqs(this.cache.get(id)).filter((seq) => seq < floor);
    if (cached.length > 0) {
      const shown = cached.slice(-PAGE);
      const fromBottom = box.scrollHeight - box.scrollTop;
      this.setBusy(true);
      this.floor = shown[0];
      this.hasOlder = cached.length > PAGE || this.floor > 1;
      this.showAll();
      box.scrollTop = box.scrollHeight - fromBottom;
      this.historyState();
      this.setBusy(false);
      return;
    }
    this.loadingOlder = true;
    this.historyState("Loading older messages…");
    this.setBusy(true);
    try {
      const page = await this.page(id, { beforeSeq: floor, limit: PAGE });
      if (generation !== this.generation) return;
      const fromBottom = box.scrollHeight - box.scrollTop;
      this.merge(id, page.messages, true);
      this.floor = Math.min(this.floor, page.messages[0]?.seq ?? this.floor);
      this.hasOlder = page.hasMore;
      this.showAll();
      box.scrollTop = box.scrollHeight - fromBottom;
      this.historyState();
      this.refreshReceipts();
    } catch (err) {
      if (generation === this.generation) {
        this.alert(`Could not load older messages: ${describe(err)}`);
        this.historyState();
      }
    } finally {
      this.loadingOlder = false;
      if (generation === this.generation) this.setBusy(false);
    }
  }

  /** A page of history with each message's preview (kinds this client has no view of). */
  page(conversationId, query) {
    return this.client.api.request("GET", `/v1/conversations/${conversationId}/messages`, {
      query: { ...query, previews: true },
    });
  }

  /**
   * `aria-busy` on the message log while many messages go in at once (opening a chat, a
   * page of older ones), so screen readers do not read them all out. It is cleared after
   * the next frame, once the accessibility tree has seen the whole batch.
   */
  setBusy(on) {
    const box = $("#messages");
    const token = (this.busyToken = (this.busyToken ?? 0) + 1);
    if (on) box.setAttribute("aria-busy", "true");
    else requestAnimationFrame(() => this.busyToken === token && box.setAttribute("aria-busy", "false"));
  }

  /** A problem the reader must hear of: the chat's alert line. */
  alert(text) {
    $("#send-error").textContent = text;
  }

  historyState(text) {
    const el = $("#history-state");
    if (text) return fill(el, text);
    if (this.hasOlder) {
      fill(el, h("button", { class: "link", onclick: () => this.loadOlder() }, "Load older messages"));
    } else {
      fill(el, this.items.size ? "Beginning of the conversation" : "No messages yet");
    }
  }

  onScroll() {
    const box = $("#messages");
    if (this.ready && box.scrollTop < 80) void this.loadOlder();
    if (this.atBottom()) {
      this.markRead();
      this.bound();
    }
  }

  atBottom() {
    const box = $("#messages");
    return box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  }

  scrollToBottom() {
    const box = $("#messages");
    box.scrollTop = box.scrollHeight;
  }

  // ---- the cache and the list on screen

  /** Makes a conversation's cache the most recently opened. */
  touch(conversationId) {
    const map = this.cache.get(conversationId);
    if (!map) return;
    this.cache.delete(conversationId);
    this.cache.set(conversationId, map);
  }

  /**
   * Keeps the open chat at SHOWN messages while the reader is at the bottom: the oldest
   * leave the list, the items and the cache (scrolling up or *Load older messages* pulls
   * them again).
   */
  bound() {
    const id = this.current?.conversationId;
    if (!id || this.items.size <= SHOWN || !this.atBottom()) return;
    const seqs = [...this.items.keys()].sort((a, b) => a - b);
    const drop = seqs.length - SHOWN;
    for (const seq of seqs.slice(0, drop)) {
      this.items.get(seq).remove();
      this.items.delete(seq);
      this.groupReceipts.delete(seq);
    }
    this.floor = seqs[drop];
    const map = this.cache.get(id);
    for (const seq of [...(map?.keys() ?? [])]) if (seq < this.floor) map.delete(seq);
    this.hasOlder = true;
    this.historyState();
    this.scrollToBottom();
  }

  merge(conversationId, messages, older = false) {
    let map = this.cache.get(conversationId);
    if (!map) {
      this.cache.set(conversationId, (map = new Map()));
      this.evict();
    }
    for (const m of messages) {
      const known = map.get(m.seq);
      // A pulled copy is the stored (normalized) form; keep a preview already fetched.
      const next = { ...m, preview: m.preview ?? known?.preview };
      if (!known || !same(known, next)) map.set(m.seq, next);
    }
    if (!older && conversationId !== this.current?.conversationId) trim(map);
  }

  /** Forgets the least recently opened conversations beyond CHATS (never the one on screen). */
  evict() {
    for (const id of this.cache.keys()) {
      if (this.cache.size <= CHATS) break;
      if (id !== this.current?.conversationId) this.cache.delete(id);
    }
  }

  /** Shows the newest PAGE cached messages (and keeps what is on screen already). */
  showLatest() {
    const seqs = sortedSeqs(this.cache.get(this.current?.conversationId));
    if (seqs.length > 0) this.floor = Math.min(this.floor, seqs[Math.max(0, seqs.length - PAGE)]);
    this.showAll();
  }

  /** Puts every cached message from the floor up on screen (replacing what changed). */
  showAll() {
    const map = this.cache.get(this.current?.conversationId);
    if (!map) return;
    for (const seq of sortedSeqs(map)) {
      const m = map.get(seq);
      if (seq >= this.floor && this.items.get(seq)?.message !== m) this.show(m);
    }
  }

  /** Adds or replaces a message's `<li>`, in seq order. */
  show(m) {
    const list = $("#message-list");
    let el = this.item(m);
    el.message = m;
    const known = this.items.get(m.seq);
    if (known) {
      // The same <li>, its attributes and content replaced: a change, not a new message.
      for (const name of known.getAttributeNames()) if (!el.hasAttribute(name)) known.removeAttribute(name);
      for (const name of el.getAttributeNames()) known.setAttribute(name, el.getAttribute(name));
      known.replaceChildren(...el.childNodes);
      known.message = m;
      el = known;
    } else {
      let next = null;
      for (const [seq, li] of this.items) if (seq > m.seq && (!next || seq < Number(next.dataset.seq))) next = li;
      if (next) list.insertBefore(el, next);
      else {
        const firstPending = list.querySelector("li.pending");
        list.insertBefore(el, firstPending);
      }
    }
    this.items.set(m.seq, el);
    const waiting = this.acked.get(`${m.conversationId}:${m.seq}`);
    if (waiting) {
      this.acked.delete(`${m.conversationId}:${m.seq}`);
      this.pending.get(waiting)?.el.remove();
      this.pending.delete(waiting);
    }
    if (!isBundled(m.contentType) && m.preview === undefined && !m.previewFailed && m.payload !== null) {
      this.wantPreview(m);
    }
  }

  item(m) {
    const mine = m.senderId === this.me;
    const group = m.conversationType !== 1;
    const kindName = this.state.plugins.get(m.contentType)?.name;
    const body = renderBody(m, { me: this.me, preview: m.preview, previewFailed: m.previewFailed, kindName });
    if (isTip(m)) {
      return h("li", { class: "tip", dataset: { seq: String(m.seq) } }, body, " ", h("time", { class: "muted small" }, time(m.serverTime)));
    }
    const recallable = mine && m.payload !== null && !m.recalledBy;
    return h(
      "li",
      {
        class: `msg ${mine ? "mine" : "theirs"}`,
        dataset: { seq: String(m.seq), kind: String(m.contentType) },
      },
      group && !mine ? h("span", { class: "sender" }, m.senderId) : null,
      h("div", { class: "bubble" }, h("span", { class: "visually-hidden" }, mine ? "You: " : group ? "" : `${m.senderId}: `), body),
      h(
        "div",
        { class: "meta small muted" },
        h("time", { datetime: new Date(m.serverTime).toISOString() }, time(m.serverTime)),
        mine ? h("span", { class: "status" }, this.statusText(m)) : null,
        recallable
          ? h("button", { class: "link recall", onclick: () => this.recallMessage(m), "aria-label": `Recall your message sent at ${time(m.serverTime)}` }, "Recall")
          : null,
      ),
    );
  }

  statusText(m) {
    if (m.payload === null || m.recalledBy) return "";
    if (m.conversationType === 1) {
      if (this.peer.readSeq >= m.seq) return "Read";
      if (this.peer.deliveredSeq >= m.seq) return "Delivered";
      return "Sent";
    }
    const r = this.groupReceipts.get(m.seq);
    if (!r || r.of === 0) return "Sent";
    if (r.read > 0) return `Read by ${r.read} of ${r.of}`;
    if (r.delivered > 0) return `Delivered to ${r.delivered} of ${r.of}`;
    return "Sent";
  }

  /** Updates the receipt line of my messages on screen (text only: nothing is re-announced). */
  updateStatuses() {
    const map = this.cache.get(this.current?.conversationId);
    if (!map) return;
    for (const [seq, li] of this.items) {
      const status = li.querySelector(".status");
      const m = map.get(seq);
      if (status && m) status.textContent = this.statusText(m);
    }
  }

  // ---- SDK events

  /** Hello of a session: whether the server keeps delivered positions. */
  session(hello) {
    this.receipts = hello.receipts !== false;
  }

  /** Caught up after (re)connecting: positions may have moved meanwhile. */
  online(hello) {
    this.session(hello);
    this.refreshReceipts();
  }

  message(m) {
    this.merge(m.conversationId, [m]);
    if (m.senderId !== this.me) this.scheduleReceived(m.conversationId, m.seq);
    const c = this.current;
    if (c && !c.conversationId && m.conversationType === 1 && m.senderId === c.peerId) this.adopt(m.conversationId);
    if (c?.conversationId !== m.conversationId) return;
    const stick = this.atBottom() || m.senderId === this.me;
    if (!Number.isFinite(this.floor)) this.floor = m.seq;
    if (m.seq < this.floor) return;
    this.show(m);
    if (this.hasOlder === false) this.historyState();
    const typers = this.typingUsers.get(m.conversationId);
    if (typers?.delete(m.senderId)) this.renderTyping();
    if (stick) {
      this.scrollToBottom();
      this.bound();
    }
    this.markRead();
    if (m.conversationType !== 1) this.refreshReceiptsSoon();
  }

  recall(r) {
    const map = this.cache.get(r.conversationId);
    const target = map?.get(r.targetSeq);
    if (!target) return;
    const hidden = { ...target, payload: null, recalledBy: r.seq };
    map.set(r.targetSeq, hidden);
    if (this.current?.conversationId === r.conversationId && this.items.has(r.targetSeq)) this.show(hidden);
  }

  read(r) {
    if (r.userId === this.me || this.current?.conversationId !== r.conversationId) return;
    if (this.current.conversationType !== 1) return;
    this.peer.readSeq = Math.max(this.peer.readSeq, r.readSeq);
    this.peer.deliveredSeq = Math.max(this.peer.deliveredSeq, r.readSeq);
    this.updateStatuses();
  }

  delivered(d) {
    if (d.userId === this.me || this.current?.conversationId !== d.conversationId) return;
    this.peer.deliveredSeq = Math.max(this.peer.deliveredSeq, d.seq);
    this.updateStatuses();
  }

  typing(t) {
    if (t.userId === this.me) return;
    let users = this.typingUsers.get(t.conversationId);
    if (!users) this.typingUsers.set(t.conversationId, (users = new Map()));
    if (t.state === "typing") {
      users.set(t.userId, Date.now() + TYPING_SHOWN_MS);
      setTimeout(() => this.renderTyping(), TYPING_SHOWN_MS + 50);
    } else {
      users.delete(t.userId);
    }
    this.renderTyping();
  }

  renderTyping() {
    const users = this.typingUsers.get(this.current?.conversationId);
    const now = Date.now();
    const names = [];
    for (const [u, until] of users ?? []) {
      if (until > now) names.push(u);
      else users.delete(u);
    }
    $("#typing").textContent =
      names.length === 0 ? "" : names.length === 1 ? `${names[0]} is typing…` : `${names.join(", ")} are typing…`;
  }

  /** A live kind other than typing: call signals get a line (never stored). */
  live(frame) {
    if (frame.contentType !== KIND.rtcCall || this.current?.conversationId !== frame.conversationId) return;
    const line = callLine(frame, this.me);
    if (!line) return;
    $("#message-list").append(h("li", { class: "tip live" }, line));
    if (this.atBottom()) this.scrollToBottom();
  }

  conversationChanged(entry) {
    const c = this.current;
    if (c && !c.conversationId && entry.conversationType === 1 && entry.peerId === c.peerId) {
      this.adopt(entry.conversationId);
      return;
    }
    if (c?.conversationId !== entry.conversationId) return;
    this.refreshHeader();
    // An entry reloaded before our last read committed says unread again: read once more
    // (only below what is on screen, so this cannot go round).
    if (entry.unread > 0 && entry.readSeq < maxKey(this.cache.get(entry.conversationId))) this.markRead();
  }

  // ---- positions and receipts

  markRead() {
    const id = this.current?.conversationId;
    if (!id || document.visibilityState !== "visible" || !this.atBottom()) return;
    const top = maxKey(this.cache.get(id));
    const entry = this.state.conversations.get(id);
    if (top <= 0 || (entry && entry.readSeq >= top && entry.unread === 0)) return;
    // One read in flight at a time; a burst of messages ends in one more for the last.
    if (this.reading) {
      this.readAgain = true;
      return;
    }
    this.reading = true;
    this.client
      .markRead(id, top)
      .catch((err) => console.warn("read", err))
      .finally(() => {
        this.reading = false;
        if (this.readAgain) {
          this.readAgain = false;
          this.markRead();
        }
      });
  }

  /** One `received` per conversation and burst: the highest seq that came. */
  scheduleReceived(conversationId, seq) {
    if (!this.receipts) return;
    const known = this.receivedTimers.get(conversationId);
    if (known) {
      known.seq = Math.max(known.seq, seq);
      return;
    }
    const entry = { seq };
    this.receivedTimers.set(conversationId, entry);
    setTimeout(() => {
      this.receivedTimers.delete(conversationId);
      this.client.markReceived(conversationId, entry.seq).catch((err) => console.warn("received", err));
    }, 200);
  }

  refreshReceiptsSoon() {
    clearTimeout(this.receiptsTimer);
    this.receiptsTimer = setTimeout(() => this.refreshReceipts(), 300);
  }

  /** The peer's positions (private) or the receipt counts of my messages on screen (group). */
  async refreshReceipts() {
    const c = this.current;
    if (!c?.conversationId) return;
    const generation = this.generation;
    try {
      if (c.conversationType === 1) {
        const { positions } = await this.client.api.request("GET", `/v1/conversations/${c.conversationId}/read-positions`);
        if (generation !== this.generation) return;
        const p = positions.find((x) => x.userId !== this.me);
        if (p) {
          this.peer.readSeq = Math.max(this.peer.readSeq, p.readSeq);
          this.peer.deliveredSeq = Math.max(this.peer.deliveredSeq, p.deliveredSeq);
        }
      } else if (c.conversationType === 2) {
        const map = this.cache.get(c.conversationId) ?? new Map();
        const seqs = [...this.items.keys()]
          .filter((s) => {
            const m = map.get(s);
            return m && m.senderId === this.me && !isTip(m) && m.payload !== null;
          })
          .sort((a, b) => a - b)
          .slice(-100);
        if (seqs.length === 0) return;
        const { receipts } = await this.client.api.request("POST", `/v1/groups/${c.conversationId}/receipts`, {
          body: { seqs },
        });
        if (generation !== this.generation) return;
        for (const r of receipts) this.groupReceipts.set(r.seq, r);
      }
      this.updateStatuses();
    } catch (err) {
      console.warn("receipts", err);
    }
  }

  // ---- previews of kinds this client has no view of

  wantPreview(m) {
    let seqs = this.previewWanted.get(m.conversationId);
    if (!seqs) this.previewWanted.set(m.conversationId, (seqs = new Set()));
    seqs.add(m.seq);
    if (this.previewTimer) return;
    this.previewTimer = setTimeout(() => {
      this.previewTimer = null;
      const wanted = this.previewWanted;
      this.previewWanted = new Map();
      for (const [conversationId, set] of wanted) void this.fetchPreviews(conversationId, [...set]);
    }, 50);
  }

  async fetchPreviews(conversationId, seqs, attempt = 0) {
    const low = Math.min(...seqs);
    const high = Math.max(...seqs);
    try {
      const page = await this.page(conversationId, { afterSeq: low - 1, limit: Math.min(high - low + 1, 500) });
      const map = this.cache.get(conversationId);
      for (const pulled of page.messages) {
        const known = map?.get(pulled.seq);
        if (!known || pulled.preview === undefined) continue;
        const withPreview = { ...known, preview: pulled.preview };
        map.set(pulled.seq, withPreview);
        if (this.current?.conversationId === conversationId && this.items.has(pulled.seq)) this.show(withPreview);
      }
    } catch (err) {
      console.warn("previews", err);
      const wait = PREVIEW_RETRIES_MS[attempt];
      if (wait !== undefined) {
        setTimeout(() => void this.fetchPreviews(conversationId, seqs, attempt + 1), wait);
        return;
      }
      // Given up: say so rather than wait forever (a later re-render does not ask again).
      const map = this.cache.get(conversationId);
      for (const seq of seqs) {
        const known = map?.get(seq);
        if (!known || known.preview !== undefined) continue;
        const failed = { ...known, previewFailed: true };
        map.set(seq, failed);
        if (this.current?.conversationId === conversationId && this.items.has(seq)) this.show(failed);
      }
    }
  }

  // ---- sending

  async sendText() {
    const box = $("#composer-text");
    const text = box.value.trim();
    if (!text || !this.current) return;
    box.value = "";
    this.stopTyping();
    await this.send(KIND.text, { text }, text);
  }

  /** Sends a stored kind; the message shows as pending until its seq arrives. */
  async send(contentType, payload, label, clientMsgId = newClientMsgId()) {
    const target = this.target();
    const key = this.key();
    fill($("#send-error"));
    const status = h("span", { class: "status" }, "Sending…");
    const el = h(
      "li",
      { class: "msg mine pending", dataset: { clientMsgId } },
      h("div", { class: "bubble" }, h("span", { class: "visually-hidden" }, "You: "), label),
      h("div", { class: "meta small muted" }, status),
    );
    this.pending.get(clientMsgId)?.el.remove();
    this.pending.set(clientMsgId, { el, key });
    $("#message-list").append(el);
    this.scrollToBottom();
    try {
      const ack = await this.client.send({ ...target, contentType, payload, clientMsgId });
      if (this.key() === key && !this.current.conversationId) this.adopt(ack.conversationId);
      const onScreen = this.current?.conversationId === ack.conversationId && this.items.has(ack.seq);
      const cached = this.cache.get(ack.conversationId)?.has(ack.seq);
      if (onScreen || cached) {
        el.remove();
        this.pending.delete(clientMsgId);
      } else {
        this.acked.set(`${ack.conversationId}:${ack.seq}`, clientMsgId);
      }
    } catch (err) {
      el.classList.add("failed");
      const again = () => {
        el.remove();
        this.pending.delete(clientMsgId);
        void this.send(contentType, payload, label, clientMsgId);
      };
      const drop = () => {
        el.remove();
        this.pending.delete(clientMsgId);
      };
      fill(
        status,
        `Not sent: ${describe(err)} `,
        h("button", { class: "link", onclick: again }, "Retry"),
        " ",
        h("button", { class: "link", onclick: drop }, "Discard"),
      );
      if (this.key() === key) $("#send-error").textContent = `Not sent: ${describe(err)}`;
    }
  }

  async recallMessage(m) {
    fill($("#send-error"));
    try {
      await this.client.send({
        conversationType: m.conversationType,
        conversationId: m.conversationId,
        contentType: KIND.recall,
        payload: { seq: m.seq },
      });
    } catch (err) {
      $("#send-error").textContent = `Could not recall: ${describe(err)}`;
    }
  }

  async addMember() {
    const input = $("#add-member-user");
    const userIds = input.value
      .split(/[\s,]+/)
      .map((u) => u.trim())
      .filter(Boolean);
    const c = this.current;
    if (!userIds.length || !c?.conversationId) return;
    fill($("#send-error"));
    try {
      await this.client.api.request("POST", `/v1/groups/${c.conversationId}/members`, { body: { userIds } });
      input.value = "";
    } catch (err) {
      $("#send-error").textContent = `Could not add ${userIds.join(", ")}: ${describe(err)}`;
    }
  }

  onInput() {
    const text = $("#composer-text").value;
    const target = this.target();
    if (!target || target.conversationType > 2) return;
    if (!text.trim()) return this.stopTyping();
    const now = Date.now();
    if (now - this.lastTypingSent < TYPING_EVERY_MS) return;
    this.lastTypingSent = now;
    this.client.typing(target, "typing").catch(() => {});
  }

  stopTyping() {
    if (!this.lastTypingSent) return;
    this.lastTypingSent = 0;
    const target = this.target();
    if (target && target.conversationType <= 2) this.client.typing(target, "stopped").catch(() => {});
  }
}

/** Whether two copies of a message would look the same. */
function same(a, b) {
  return (
    a.preview === b.preview &&
    a.previewFailed === b.previewFailed &&
    a.recalledBy === b.recalledBy &&
    a.senderId === b.senderId &&
    JSON.stringify(a.payload) === JSON.stringify(b.payload)
  );
}

function sortedSeqs(map) {
  return [...(map?.keys() ?? [])].sort((a, b) => a - b);
}

function maxKey(map) {
  let max = 0;
  for (const k of map?.keys() ?? []) if (k > max) max = k;
  return max;
}

function minKey(map) {
  let min = Infinity;
  for (const k of map?.keys() ?? []) if (k < min) min = k;
  return min;
}

/** Keeps the newest KEEP messages of a conversation not on screen. */
function trim(map) {
  if (map.size <= KEEP) return;
  const seqs = [...map.keys()].sort((a, b) => a - b);
  for (const s of seqs.slice(0, seqs.length - KEEP)) map.delete(s);
}
