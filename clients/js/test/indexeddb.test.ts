// The IndexedDB cursor store, on an in-memory IndexedDB (fake-indexeddb): what one page
// wrote, the next page reads, and no write moves a cursor back.

import assert from "node:assert/strict";
import { test } from "node:test";

import { IDBFactory } from "fake-indexeddb";

import { IndexedDbCursorStore } from "../src/indexeddb.js";

test("cursors survive a reload and only move forward", async () => {
  const indexedDB = new IDBFactory();
  const first = new IndexedDbCursorStore("courier-alice-laptop", indexedDB);
  assert.equal(await first.getSeq(7), undefined);
  assert.equal(await first.getUserStream(), undefined);
  await first.setSeq(7, 12);
  await first.setSeq(7, 9); // another tab behind this one
  await first.setSeq(8, 1);
  await first.setUserStream({ epoch: 1, seq: 30 });
  await first.setUserStream({ epoch: 2, seq: 0 }); // a reset: a new epoch starts at 0
  await first.setUserStream({ epoch: 1, seq: 31 }); // late, of the old epoch
  await first.close();

  const reloaded = new IndexedDbCursorStore("courier-alice-laptop", indexedDB);
  assert.equal(await reloaded.getSeq(7), 12);
  assert.equal(await reloaded.getSeq(8), 1);
  assert.deepEqual(await reloaded.getUserStream(), { epoch: 2, seq: 0 });
  const other = new IndexedDbCursorStore("courier-bob-phone", indexedDB);
  assert.equal(await other.getSeq(7), undefined, "one database per user and device");
  await reloaded.close();
  await other.close();
});
