// Public surface of the TypeScript client: the generated messages and stubs
// (./gen, from protos/ by ts-proto) and the helpers over them.

export * from "./coordinator";
export * from "./crc32c";
export * from "./dial";
export * from "./errors";
export * from "./paramserver";
export * from "./tensor";
export * as common from "./gen/stalwart/v1/common";
export * as coordinatorpb from "./gen/stalwart/v1/coordinator";
export * as paramserverpb from "./gen/stalwart/v1/paramserver";
export * as healthpb from "./gen/stalwart/v1/health";
export * as trainerpb from "./gen/stalwart/v1/trainer";
