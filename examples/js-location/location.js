// `location` (content type 1002): a shared location, written in JavaScript.
//
// Built with componentize-js against Courier's WIT contract (wit/v1); see build.sh.
// componentize-js maps the WIT names to camelCase (`content-type` -> `contentType`),
// enums to their case name as a string, and `list<u8>` to a Uint8Array. An exported
// function returning `result<string, rejection>` returns the ok value, and throws
// for the error case: the thrown value's `payload` is the rejection record.

const MAX_NAME = 100;
const FIELDS = new Set(["lat", "lon", "name"]);
// A `\ud800` escape parses to half a surrogate pair, which is not text: refuse it.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

class Rejection extends Error {
  constructor(code, message) {
    super(message);
    this.payload = { code, message };
  }
}

function reject(code, message) {
  throw new Rejection(code, message);
}

function coordinate(value, field, limit) {
  if (typeof value !== "number") {
    reject("invalid_field", `${field} must be a number`);
  }
  if (!(value >= -limit && value <= limit)) {
    reject("out_of_range", `${field} must be between -${limit} and ${limit}`);
  }
  // -0 and 0 print alike; keep the value as JSON.stringify will print it.
  return value === 0 ? 0 : value;
}

// Counts code points, not UTF-16 units, without walking the string in JS
// (iterating a long string costs far more fuel than one native regex pass).
function codePoints(s) {
  if (s.length <= MAX_NAME) return s.length;
  const pairs = s.match(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g);
  return s.length - (pairs === null ? 0 : pairs.length);
}

function normalize(payload) {
  let loc;
  try {
    loc = JSON.parse(payload);
  } catch (e) {
    reject("malformed_json", `payload is not valid JSON: ${e.message}`);
  }
  if (loc === null || typeof loc !== "object" || Array.isArray(loc)) {
    reject("invalid_field", "payload must be a JSON object");
  }
  const unknown = Object.keys(loc).filter((k) => !FIELDS.has(k)).sort();
  if (unknown.length > 0) {
    reject("invalid_field", `unknown field ${unknown[0]}`);
  }
  const out = {
    lat: coordinate(loc.lat, "lat", 90),
    lon: coordinate(loc.lon, "lon", 180),
  };
  if ("name" in loc) {
    if (typeof loc.name !== "string") {
      reject("invalid_field", "name must be a string");
    }
    const name = loc.name.trim();
    if (LONE_SURROGATE.test(name)) {
      reject("invalid_field", "name must be valid Unicode text");
    }
    if (name.length === 0) {
      reject("empty", "name must not be blank");
    }
    if (codePoints(name) > MAX_NAME) {
      reject("too_long", `name is at most ${MAX_NAME} characters`);
    }
    out.name = name;
  }
  return out;
}

export const kind = {
  manifest() {
    return {
      name: "example-location",
      version: "1.0.0",
      contentType: 1002,
      delivery: "persistent",
      countsUnread: true,
      conversationTypes: Uint8Array.of(1, 2),
      sender: "user",
      maxPayloadBytes: 2048,
      description:
        "A shared location: latitude, longitude and an optional place name (example plugin in JavaScript)",
    };
  },

  validate(ctx, payload) {
    return JSON.stringify(normalize(payload));
  },

  preview(payload) {
    let loc;
    try {
      loc = normalize(payload);
    } catch (e) {
      return "";
    }
    return loc.name === undefined ? "[location]" : `[location] ${loc.name}`;
  },

  examples() {
    return [
      { name: "basic", conversationType: 1, payload: '{"lat":48.8584,"lon":2.2945}', accepted: true },
      { name: "named", conversationType: 2, payload: '{"lat":-33.8568,"lon":151.2153,"name":"  Sydney Opera House "}', accepted: true },
      { name: "lat-out-of-range", conversationType: 1, payload: '{"lat":91,"lon":0}', accepted: false },
      { name: "lon-not-number", conversationType: 2, payload: '{"lat":0,"lon":"12.5"}', accepted: false },
      { name: "unknown-field", conversationType: 1, payload: '{"lat":0,"lon":0,"alt":35}', accepted: false },
      { name: "blank-name", conversationType: 2, payload: '{"lat":0,"lon":0,"name":"   "}', accepted: false },
      { name: "malformed", conversationType: 1, payload: '{"lat":0,', accepted: false },
    ];
  },
};
