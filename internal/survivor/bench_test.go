package survivor

const benchServerEnv = "ITERON_SURVIVOR_BENCH_SERVER"

func runBenchServer(dir string) int { return 0 }
