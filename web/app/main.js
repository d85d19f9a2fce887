// The Courier web client: logging in, the conversation list, friends and groups. The
// connection, sends and catch-up are the SDK's (`/web/vendor/courier-client`, built from
// clients/js); this file binds its events to the page. The chat view is chat.js.

import { CourierClient, login, register } from "/web/vendor/courier-client/index.js";
import { IndexedDbCursorStore } from "/web/vendor/courier-client/indexeddb.js";
import { $, describe, fill, h, time } from "./dom.js";
import { ChatView } from "./chat.js";

const SESSION_KEY = "courier.session";
const url = location.origin;

/** What the page knows; the SDK's events keep it current. */
const state = {
  client: null,
  me: "",
  /** conversationId → overview entry (the SDK's `conversation` events). */
  conversations: new Map(),
  /** conversationId → group info (`GET /v1/groups`, group events). */
  groups: new Map(),
  friends: new Set(),
  /** requestId → request, pending only. */
  requestsIn: new Map(),
  requestsOut: new Map(),
  /** contentType → plugin (`GET /v1/plugins`): kind names. */
  plugins: new Map(),
};

let chat = null;

// ---- sessions

function savedSession() {
  try {
    const s = JSON.parse(localStorage.getItem(SESSION_KEY) ?? "null");
    return s && s.token && s.expiresAt * 1000 > Date.now() ? s : null;
  } catch {
    return null;
  }
}

/** Where the browser keeps a user's device id. */
function deviceKey(userId) {
  return `courier.device.${userId}`;
}

/** One device id per user per browser profile (two tabs replace each other's connection). */
function deviceId(userId) {
  const key = deviceKey(userId);
  let id = localStorage.getItem(key);
  if (!id) {
    const bytes = crypto.getRandomValues(new Uint8Array(6));
    id = "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    localStorage.setItem(key, id);
  }
  return id;
}

function showAuth(message = "") {
  $("#app").hidden = true;
  $("#auth").hidden = false;
  $("#auth-error").textContent = message;
  $("#auth-user").focus();
}

async function onAuth(event) {
  event.preventDefault();
  const action = event.submitter?.value ?? "login";
  const userId = $("#auth-user").value.trim();
  const password = $("#auth-password").value;
  const error = $("#auth-error");
  if (!/^[A-Za-z0-9_.@-]{1,64}$/.test(userId)) {
    error.textContent = "A user id is 1 to 64 letters, digits, or _ . @ -";
    return;
  }
  if (password.length < 8) {
    error.textContent = "The password needs at least 8 characters";
    return;
  }
  error.textContent = action === "register" ? "Creating the account…" : "Logging in…";
  try {
    const credentials = await (action === "register" ? register : login)(url, userId, password);
    localStorage.setItem(SESSION_KEY, JSON.stringify(credentials));
    $("#auth-password").value = "";
    error.textContent = "";
    start(credentials);
  } catch (err) {
    error.textContent = describe(err);
  }
}

async function logout() {
  const client = state.client;
  try {
    await client?.api.request("POST", "/v1/auth/logout");
  } catch {
    // the token may already be gone; the session ends here anyway
  }
  client?.close();
  localStorage.removeItem(SESSION_KEY);
  location.reload();
}

// ---- the session

function start(session) {
  state.me = session.userId;
  const id = deviceId(session.userId);
  const client = new CourierClient({
    url,
    token: session.token,
    deviceId: id,
    store: new IndexedDbCursorStore(`courier-${session.userId}-${id}`),
  });
  state.client = client;
  chat = new ChatView({ client, state, title, onOpen: renderConversations });
  $("#auth").hidden = true;
  $("#app").hidden = false;
  $("#me").textContent = session.userId;
  wire(client);
  client.connect();
  loadPlugins();
  renderConversations();
  renderFriends();
}

async function loadPlugins() {
  try {
    const { plugins } = await state.client.api.request("GET", "/v1/plugins");
    for (const p of plugins) state.plugins.set(p.contentType, p);
  } catch {
    // names are a nicety: kinds still show by their preview
  }
}

function wire(client) {
  client.on("state", onState);
  client.on("conversation", (entry) => {
    state.conversations.set(entry.conversationId, entry);
    if (entry.conversationType !== 1 && !state.groups.has(entry.conversationId)) loadGroup(entry.conversationId);
    scheduleRender();
    chat.conversationChanged(entry);
  });
  client.on("message", (m) => {
    chat.message(m);
    announce(m);
    if (m.contentType === 8 || m.contentType === 9) loadGroup(m.conversationId);
  });
  client.on("recall", (r) => chat.recall(r));
  client.on("read", (r) => chat.read(r));
  client.on("delivered", (d) => chat.delivered(d));
  client.on("typing", (t) => chat.typing(t));
  client.on("live", (f) => chat.live(f));
  client.on("snapshot", onSnapshot);
  client.on("userEvent", onUserEvent);
  client.on("syncError", (err) => console.warn("sync:", err));
}

function onState(s) {
  const conn = $("#conn");
  conn.dataset.state = s.state;
  switch (s.state) {
    case "connecting":
      conn.textContent = "Connecting…";
      break;
    case "syncing":
      conn.textContent = "Syncing…";
      chat.session(s.hello);
      banner("");
      break;
    case "online":
      conn.textContent = "Online";
      chat.online(s.hello);
      break;
    case "waiting":
      conn.textContent = `Offline, retrying in ${Math.ceil(s.delayMs / 1000)} s`;
      break;
    case "closed":
      conn.textContent = "Disconnected";
      if (s.reason === "replaced") {
        banner("This account is open in another tab or window.", "Use it here", () => {
          banner("");
          state.client.connect();
        });
      } else if (s.reason === "device_removed") {
        // Its id may not connect again: the next login here is a new device.
        localStorage.removeItem(SESSION_KEY);
        localStorage.removeItem(deviceKey(state.me));
        showAuth("This browser was removed from your devices: log in to use it again.");
      } else if (["token_revoked", "unauthorized", "account_deleted"].includes(s.reason)) {
        localStorage.removeItem(SESSION_KEY);
        showAuth(
          s.reason === "account_deleted" ? "This account was deleted." : "Your session ended: log in again.",
        );
      }
      break;
  }
}

/**
 * Tells screen readers of a new message in a conversation that is not on screen (the open
 * chat is a live region of its own). Only live ones: not what a catch-up brings.
 */
function announce(m) {
  if (m.senderId === state.me || state.client.state.state !== "online") return;
  if (m.conversationId === chat.current?.conversationId) return;
  // Kinds that count toward unread are messages; recalls and tips are not news.
  if (state.plugins.get(m.contentType)?.countsUnread === false) return;
  const entry = state.conversations.get(m.conversationId);
  const where = entry && entry.conversationType !== 1 ? ` in ${title(entry)}` : "";
  const text = m.contentType === 1 && m.payload ? `: ${m.payload.text}` : "";
  $("#announce").textContent = `New message from ${m.senderId}${where}${text}`;
}

/** A message above the layout (empty: hidden), with an optional action button. */
function banner(text, action, onAction) {
  const el = $("#banner");
  el.hidden = !text;
  fill(el, text, action ? h("button", { class: "secondary", onclick: onAction }, action) : null);
}

// ---- friends and groups

function onSnapshot(snapshot) {
  state.friends = new Set(snapshot.friends.map((f) => f.userId));
  state.requestsIn = new Map(snapshot.friendRequestsIn.map((r) => [r.requestId, r]));
  state.requestsOut = new Map(snapshot.friendRequestsOut.map((r) => [r.requestId, r]));
  for (const g of snapshot.groups) state.groups.set(g.conversationId, g);
  renderFriends();
  scheduleRender();
  chat.refreshHeader();
}

function onUserEvent(e) {
  const d = e.data ?? {};
  switch (e.event) {
    case "friend.request": {
      const mine = d.fromUserId === state.me;
      const map = mine ? state.requestsOut : state.requestsIn;
      if (d.action === "requested") {
        map.set(d.requestId, { ...d, message: d.message ?? "", state: "pending" });
      } else {
        map.delete(d.requestId);
      }
      break;
    }
    case "friend.added":
      state.friends.add(d.userId);
      break;
    case "friend.removed":
      state.friends.delete(d.userId);
      break;
    case "group.joined":
    case "group.left":
    case "group.kicked":
    case "group.dissolved":
    case "group.role": {
      // GET /v1/groups/{id} does not say whether we are a member: the stream does.
      const known = state.groups.get(d.conversationId) ?? { conversationId: d.conversationId };
      const next = { ...known, conversationType: d.conversationType ?? known.conversationType };
      if (e.event === "group.joined") next.memberState = "member";
      if (e.event === "group.left") next.memberState = "left";
      if (e.event === "group.kicked") next.memberState = "kicked";
      if (e.event === "group.dissolved") Object.assign(next, { memberState: "dissolved", state: "dissolved" });
      if (d.role && (e.event === "group.joined" || e.event === "group.role")) next.role = d.role;
      state.groups.set(d.conversationId, next);
      scheduleRender();
      chat.refreshHeader();
      loadGroup(d.conversationId);
      break;
    }
  }
  renderFriends();
}

const loadingGroups = new Map();

/** Reloads one group's info (its name, members count, our membership). */
function loadGroup(conversationId) {
  if (loadingGroups.has(conversationId)) {
    loadingGroups.set(conversationId, true);
    return;
  }
  loadingGroups.set(conversationId, false);
  void (async () => {
    try {
      do {
        loadingGroups.set(conversationId, false);
        const info = await state.client.api.request("GET", `/v1/groups/${conversationId}`);
        state.groups.set(conversationId, { ...state.groups.get(conversationId), ...info });
      } while (loadingGroups.get(conversationId));
      scheduleRender();
      chat.refreshHeader();
    } catch (err) {
      console.warn("group", conversationId, err);
    } finally {
      loadingGroups.delete(conversationId);
    }
  })();
}

function renderFriends() {
  const inList = [...state.requestsIn.values()];
  const badge = $("#requests-badge");
  badge.hidden = inList.length === 0;
  badge.textContent = String(inList.length);
  badge.setAttribute("aria-label", `${inList.length} friend request${inList.length === 1 ? "" : "s"}`);
  fill(
    $("#requests-in"),
    inList.length
      ? inList.map((r) =>
          h(
            "li",
            { class: "request" },
            h("span", {}, h("strong", {}, r.fromUserId), r.message ? `: ${r.message}` : ""),
            h("button", { onclick: () => decide(r, "accept"), "aria-label": `Accept ${r.fromUserId}` }, "Accept"),
            h(
              "button",
              { class: "secondary", onclick: () => decide(r, "reject"), "aria-label": `Decline ${r.fromUserId}` },
              "Decline",
            ),
          ),
        )
      : h("li", { class: "muted" }, "None"),
  );
  const outList = [...state.requestsOut.values()];
  fill(
    $("#requests-out"),
    outList.length
      ? outList.map((r) =>
          h(
            "li",
            { class: "request" },
            h("span", {}, r.toUserId),
            h(
              "button",
              { class: "secondary", onclick: () => decide(r, "cancel"), "aria-label": `Cancel the request to ${r.toUserId}` },
              "Cancel",
            ),
          ),
        )
      : h("li", { class: "muted" }, "None"),
  );
  const friends = [...state.friends].sort();
  fill(
    $("#friends"),
    friends.length
      ? friends.map((f) =>
          h("li", {}, h("button", { class: "link", onclick: () => openPeer(f), "aria-label": `Chat with ${f}` }, f)),
        )
      : h("li", { class: "muted" }, "None yet"),
  );
}

async function decide(request, action) {
  const status = $("#friend-status");
  $("#friend-error").textContent = "";
  try {
    await state.client.api.request("POST", `/v1/friends/requests/${request.requestId}/${action}`);
    (action === "cancel" ? state.requestsOut : state.requestsIn).delete(request.requestId);
    if (action === "accept") state.friends.add(request.fromUserId);
    status.textContent =
      action === "accept"
        ? `You and ${request.fromUserId} are now friends`
        : action === "reject"
          ? `Declined ${request.fromUserId}'s request`
          : `Cancelled the request to ${request.toUserId}`;
    renderFriends();
  } catch (err) {
    status.textContent = "";
    $("#friend-error").textContent = describe(err);
  }
}

async function onFriendRequest(event) {
  event.preventDefault();
  const userId = $("#friend-user").value.trim();
  const message = $("#friend-message").value.trim();
  const status = $("#friend-status");
  if (!userId) return;
  $("#friend-error").textContent = "";
  try {
    const answer = await state.client.api.request("POST", "/v1/friends/requests", {
      body: message ? { userId, message } : { userId },
    });
    status.textContent =
      answer.state === "accepted" ? `You and ${userId} are now friends` : `Friend request sent to ${userId}`;
    $("#friend-user").value = "";
    $("#friend-message").value = "";
  } catch (err) {
    status.textContent = "";
    $("#friend-error").textContent = describe(err);
  }
}

async function onCreateGroup(event) {
  event.preventDefault();
  const name = $("#group-name").value.trim();
  const members = $("#group-members")
    .value.split(/[\s,]+/)
    .map((m) => m.trim())
    .filter(Boolean);
  const status = $("#group-status");
  if (!name) return;
  $("#group-error").textContent = "";
  try {
    const group = await state.client.api.request("POST", "/v1/groups", { body: { name, members } });
    state.groups.set(group.conversationId, { ...group, memberState: "member", role: "owner" });
    status.textContent = `Created ${group.name}`;
    $("#group-name").value = "";
    $("#group-members").value = "";
    $("#group-panel").open = false;
    chat.open({ conversationId: group.conversationId, conversationType: group.conversationType });
  } catch (err) {
    status.textContent = "";
    $("#group-error").textContent = describe(err);
  }
}

// ---- the conversation list

/** A private conversation with `peer`: its existing one, or a new one made by the first send. */
function openPeer(peer) {
  if (peer === state.me) {
    $("#friend-error").textContent = "That is you";
    return;
  }
  const existing = [...state.conversations.values()].find((c) => c.conversationType === 1 && c.peerId === peer);
  chat.open(existing ? { conversationId: existing.conversationId, conversationType: 1, peerId: peer } : { conversationType: 1, peerId: peer });
}

/** Whether we are in a conversation: the user stream's word for groups, else the overview's. */
function isMember(entry) {
  const memberState = state.groups.get(entry.conversationId)?.memberState;
  return memberState ? memberState === "member" : entry.member !== false;
}

function title(entry) {
  if (entry.conversationType === 1) return entry.peerId ?? "Private chat";
  return state.groups.get(entry.conversationId)?.name ?? `Group ${entry.conversationId}`;
}

let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    renderConversations();
  });
}

function renderConversations() {
  const entries = [...state.conversations.values()].sort((a, b) => b.lastTime - a.lastTime);
  const unread = entries.reduce((sum, e) => sum + (e.unread > 0 ? e.unread : 0), 0);
  document.title = unread > 0 ? `(${unread}) Courier` : "Courier";
  $("#no-conversations").hidden = entries.length > 0;
  const current = chat?.current?.conversationId;
  // Re-rendering must not take the keyboard focus away from the list.
  const focused = document.activeElement?.closest?.("#conversations li")?.dataset.conversationId;
  fill(
    $("#conversations"),
    entries.map((entry) => {
      const last = entry.lastMessage;
      const preview = last ? `${last.senderId === state.me ? "You: " : ""}${last.preview ?? ""}` : "";
      const name = title(entry);
      const unread = entry.unread;
      return h(
        "li",
        { dataset: { conversationId: String(entry.conversationId) } },
        h(
          "button",
          {
            class: "conversation",
            "aria-current": entry.conversationId === current ? "true" : false,
            onclick: () => chat.open({ conversationId: entry.conversationId, conversationType: entry.conversationType, peerId: entry.peerId ?? undefined }),
          },
          h(
            "span",
            { class: "conversation-top" },
            h(
              "span",
              { class: "conversation-title" },
              name,
              entry.conversationType === 1 ? "" : h("span", { class: "tag" }, entry.conversationType === 3 ? "channel" : "group"),
            ),
            h("time", { class: "muted small", datetime: new Date(entry.lastTime).toISOString() }, entry.lastTime ? time(entry.lastTime) : ""),
          ),
          h(
            "span",
            { class: "conversation-bottom" },
            h("span", { class: "preview muted" }, isMember(entry) ? preview : `${preview} (left)`),
            unread > 0 ? h("span", { class: "badge unread", "aria-label": `${unread} unread` }, String(unread)) : null,
          ),
        ),
      );
    }),
  );
  if (focused) $(`#conversations li[data-conversation-id="${focused}"] button`)?.focus();
}

// ---- start

document.addEventListener("DOMContentLoaded", () => {
  $("#auth-form").addEventListener("submit", onAuth);
  $("#logout").addEventListener("click", logout);
  $("#friend-form").addEventListener("submit", onFriendRequest);
  $("#group-form").addEventListener("submit", onCreateGroup);
  $("#new-chat").addEventListener("submit", (e) => {
    e.preventDefault();
    const peer = $("#new-chat-user").value.trim();
    if (!peer) return;
    $("#new-chat-user").value = "";
    openPeer(peer);
  });
  const session = savedSession();
  if (session) start(session);
  else showAuth();
});
