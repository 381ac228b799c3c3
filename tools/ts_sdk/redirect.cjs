// Preloaded into the SDK's node processes (NODE_OPTIONS=--require): examples that hard-code the
// SDK's default address "localhost:4088" are pointed at A3S_ADDRESS instead. grpc-js builds every
// channel through channel.ChannelImplementation, looked up on the module at call time, so a
// subclass there rewrites the target without touching the SDK's files.
'use strict';
const { createRequire } = require('module');
const target = process.env.A3S_ADDRESS;
const from = createRequire(process.env.A3S_TS_SDK_DIR + '/package.json');
const channel = from('@grpc/grpc-js/build/src/channel.js');
const Original = channel.ChannelImplementation;
const DEFAULTS = new Set(['localhost:4088', '127.0.0.1:4088', 'dns:localhost:4088']);
channel.ChannelImplementation = class extends Original {
  constructor(address, credentials, options) {
    super(target && DEFAULTS.has(address) ? target : address, credentials, options);
  }
};
