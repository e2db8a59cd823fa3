package gateway

const pluginEnv = "ITERON_GATEWAY_BENCH_PLUGIN"

func servePlugin() {}
