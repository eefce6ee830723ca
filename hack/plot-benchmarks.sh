#!/usr/bin/env bash
# Plots the conversation service's proxy benchmark (test/e2e BenchmarkProxyVsDirect): latency
# p50/p99 and throughput, direct to the agent vs through the service, measured in one run.
#
# Usage:
#   hack/plot-benchmarks.sh                 # run the benchmark, then plot
#   hack/plot-benchmarks.sh bench.txt       # plot a saved `go test -bench` output
# Output: docs/img/proxy-vs-direct.png (and the raw output next to it as .txt).
# Needs gnuplot (installed from Debian's gnuplot-nox when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

out_png=docs/img/proxy-vs-direct.png
out_txt=docs/img/proxy-vs-direct.txt
mkdir -p docs/img

if ! command -v gnuplot >/dev/null 2>&1; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y gnuplot-nox >/dev/null
fi

if [[ $# -ge 1 ]]; then
	cp "$1" "$out_txt"
else
	export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(hack/build-control-plane.sh --print-assets)}"
	go test ./test/e2e/ -run '^$' -bench BenchmarkProxyVsDirect -benchtime "${BENCHTIME:-1x}" -count 1 | tee "$out_txt"
fi

# go test -bench prints "value unit" pairs after the iteration count; keep the last line of the
# benchmark (the largest run when several were made).
metric() {
	awk -v unit="$1" '/^BenchmarkProxyVsDirect/ { for (i = 3; i < NF; i++) if ($(i+1) == unit) v = $i } END { print v }' "$out_txt"
}
dp50=$(metric direct-p50-µs); dp99=$(metric direct-p99-µs); drps=$(metric direct-req/s)
pp50=$(metric proxy-p50-µs); pp99=$(metric proxy-p99-µs); prps=$(metric proxy-req/s)
if [[ -z $dp50 || -z $pp50 ]]; then
	echo "plot-benchmarks: no BenchmarkProxyVsDirect metrics in $out_txt" >&2
	exit 1
fi

data=$(mktemp)
trap 'rm -f "$data"' EXIT
printf 'p50 latency\t%s\t%s\np99 latency\t%s\t%s\n' "$dp50" "$pp50" "$dp99" "$pp99" >"$data"

gnuplot <<GNUPLOT
set terminal pngcairo size 1000,420 font ",11" noenhanced
set output "$out_png"
set multiplot layout 1,2 title "Request to final reply: direct to the agent vs through the conversation service (same broker, same run)"
set datafile separator "\t"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set grid ytics
set ylabel "microseconds"
set title "Latency"
plot "$data" using 2:xtic(1) title "direct" lc rgb "#4e79a7", '' using 3 title "through the service" lc rgb "#e15759"
set title "Throughput"
set ylabel "requests/s"
set yrange [0:*]
set xtics ("direct" 0, "through the service" 1)
set datafile separator whitespace
set boxwidth 0.5
plot "-" using 1:2 with boxes notitle lc rgb "#59a14f"
0 $drps
1 $prps
e
unset multiplot
GNUPLOT
echo "wrote $out_png (direct p50 ${dp50} µs / proxy ${pp50} µs, direct ${drps} req/s / proxy ${prps} req/s)"
