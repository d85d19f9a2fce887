// The wire shapes of docs/protocol.md: HTTP bodies and WebSocket frames, as the server
// sends them (camelCase JSON). Fields the docs mark optional are optional here.
/** The content types of the bundled kinds that the SDK itself looks at. */
export const ContentType = {
    text: 1,
    image: 2,
    file: 3,
    recall: 4,
    typing: 5,
    rtcCall: 6,
    friendRequest: 7,
    groupKick: 8,
    groupUpdate: 9,
    encrypted: 10,
};
