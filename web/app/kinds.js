// How each kind of message looks. The bundled kinds have a small view of their own; any
// other kind shows the one-line preview its plugin gives (pulled with `previews=true`),
// so a kind installed on the server appears here without a change to this client.

import { ContentType } from "/web/vendor/courier-client/index.js";
import { h, bytes } from "./dom.js";

/** The bundled kinds' content types: the SDK's table, not a copy of it. */
export const KIND = ContentType;

/** Kinds shown as a centred tip rather than a bubble. */
const TIPS = new Set([KIND.recall, KIND.friendRequest, KIND.groupKick, KIND.groupUpdate]);

export function isTip(message) {
  return TIPS.has(message.contentType);
}

/** Whether this client has a view of its own for the kind. */
export function isBundled(contentType) {
  return contentType >= 1 && contentType <= 10;
}

function who(userId, me) {
  return userId === me ? "You" : userId;
}

function list(userIds, me) {
  const names = (userIds ?? []).map((u) => (u === me ? "you" : u));
  if (names.length <= 1) return names.join("");
  return `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}`;
}

/** The sentence of a group tip (`group-update`, `group-kick`). */
export function groupTip(message, me) {
  const p = message.payload ?? {};
  const op = who(p.operatorId, me);
  if (message.contentType === KIND.groupKick) {
    const reason = p.reason ? ` (${p.reason})` : "";
    return `${op} removed ${list(p.kickedUserIds, me)}${reason}`;
  }
  switch (p.event) {
    case "created": {
      const others = (p.userIds ?? []).filter((u) => u !== p.operatorId);
      return others.length ? `${op} created the group with ${list(others, me)}` : `${op} created the group`;
    }
    case "membersAdded":
      return `${op} added ${list(p.userIds, me)}`;
    case "joined":
      return `${list(p.userIds?.length ? p.userIds : [p.operatorId], me)} joined`;
    case "left":
      return `${list(p.userIds?.length ? p.userIds : [p.operatorId], me)} left`;
    case "dissolved":
      return `${op} dissolved the group`;
    case "ownerChanged":
      return `${list(p.userIds, me)} now own${p.userIds?.length === 1 && p.userIds[0] !== me ? "s" : ""} the group`;
    case "adminAdded":
      return `${op} made ${list(p.userIds, me)} admin`;
    case "adminRemoved":
      return `${op} removed ${list(p.userIds, me)} as admin`;
    case "memberMuted":
      return `${op} muted ${list(p.userIds, me)}`;
    case "memberUnmuted":
      return `${op} unmuted ${list(p.userIds, me)}`;
  }
  const changes = [];
  if (p.name !== undefined) changes.push(`renamed the group to “${p.name}”`);
  if (p.notice !== undefined) changes.push(p.notice ? `set the notice: ${p.notice}` : "cleared the notice");
  if (p.avatar !== undefined) changes.push(p.avatar ? "changed the avatar" : "removed the avatar");
  if (p.muteAll !== undefined) changes.push(p.muteAll ? "muted everyone" : "unmuted everyone");
  if (p.joinPolicy !== undefined) changes.push(`set joining to ${p.joinPolicy}`);
  return changes.length ? `${op} ${changes.join(", ")}` : `${op} changed the group`;
}

/** A live call signal as a line in the chat (never stored). */
export function callLine(frame, me) {
  const p = frame.payload ?? {};
  const from = who(frame.senderId, me);
  switch (p.action) {
    case "invite":
      return `${from} started a${p.media === "video" ? " video" : "n audio"} call`;
    case "accept":
      return `${from} accepted the call`;
    case "reject":
      return `${from} declined the call${p.reason ? ` (${p.reason})` : ""}`;
    case "cancel":
      return `${from} cancelled the call`;
    case "hangup":
      return `${from} ended the call${p.durationMs ? ` (${Math.round(p.durationMs / 1000)} s)` : ""}`;
    default:
      return null; // offer, answer, ice: signalling without a line of its own
  }
}

/** Image URLs the reader chose to load (a re-render keeps them shown). */
const shownImages = new Set();

function hostOf(url) {
  try {
    return new URL(url).host || "another site";
  } catch {
    return "another site";
  }
}

/**
 * The body of a message: a node. `preview` is the server's preview for kinds this client
 * has no view of (undefined while it is being fetched; `previewFailed` once it could not be).
 */
export function renderBody(message, { me, preview, previewFailed, kindName }) {
  const p = message.payload;
  if (p === null || message.recalledBy) return h("span", { class: "recalled" }, "This message was recalled");
  switch (message.contentType) {
    case KIND.text:
      return h("span", { class: "text" }, p.text);
    case KIND.image: {
      const src = p.thumbnail?.url ?? p.url;
      const img = () =>
        h(
          "a",
          { href: p.url, target: "_blank", rel: "noopener noreferrer" },
          h("img", {
            src,
            alt: p.caption || "image",
            width: p.thumbnail?.width ?? Math.min(p.width, 240),
            height: p.thumbnail?.height ?? Math.round((Math.min(p.width, 240) / p.width) * p.height),
          }),
        );
      // Another host learns the reader's address when its image loads: only on request.
      const host = hostOf(src);
      const show = h(
        "button",
        {
          type: "button",
          class: "secondary show-image",
          "aria-label": `Show image from ${host}`,
          onclick: () => {
            shownImages.add(src);
            const link = img();
            show.replaceWith(link);
            link.focus();
          },
        },
        "Show image",
        h("span", { class: "muted small" }, ` (${host})`),
      );
      return h(
        "figure",
        { class: "image" },
        shownImages.has(src) ? img() : show,
        p.caption ? h("figcaption", {}, p.caption) : null,
      );
    }
    case KIND.file:
      return h(
        "a",
        { class: "file", href: p.url, target: "_blank", rel: "noopener noreferrer", download: p.name },
        h("span", { class: "tag" }, "file"),
        " ",
        p.name,
        h("span", { class: "meta" }, ` · ${bytes(p.size)} · ${p.mime}`),
      );
    case KIND.recall:
      return h("span", {}, `${who(message.senderId, me)} recalled a message`);
    case KIND.friendRequest:
      return h("span", {}, p.action === "accepted" ? "You are now friends" : `Friend request ${p.action}`);
    case KIND.groupKick:
    case KIND.groupUpdate:
      return h("span", {}, groupTip(message, me));
    case KIND.encrypted:
      return h("span", { class: "encrypted" }, "Encrypted message (this client cannot decrypt it)");
    default:
      return h(
        "span",
        { class: "other-kind", dataset: { kind: String(message.contentType) } },
        h("span", { class: "kind-label" }, kindName ?? `kind ${message.contentType}`),
        " ",
        preview !== undefined
          ? preview
          : previewFailed
            ? h("span", { class: "muted" }, "preview unavailable")
            : h("span", { class: "loading" }, "…"),
      );
  }
}
