#!/usr/bin/env bash
# Plots the conversation service's proxy benchmark (test/e2e BenchmarkProxyVsDirect): latency
# p50/p99 and throughput of direct, the bare-relay floor, the service on bbolt and on Redis, one run.
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
	go test ./test/e2e/ -run '^$' -bench BenchmarkProxyVsDirect -benchtime "${BENCHTIME:-1x}" -count "${COUNT:-3}" | tee "$out_txt"
fi

# go test -bench prints "value unit" pairs after the iteration count; with -count N there are N
# lines: take the median of each metric.
metric() {
	awk -v unit="$1" '/^BenchmarkProxyVsDirect/ || /^ +1\t/ { for (i = 2; i < NF; i++) if ($(i+1) == unit) print $i }' "$out_txt" |
		sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
for col in direct floor bolt redis; do
	for m in p50-µs p99-µs req/s; do
		v=$(metric "$col-$m")
		if [[ -z $v ]]; then
			echo "plot-benchmarks: no $col-$m metric in $out_txt" >&2
			exit 1
		fi
		name=${m%%-µs}
		printf -v "${col}_${name%%/s}" '%s' "$v" # p50, p99, req
	done
done

data=$(mktemp)
trap 'rm -f "$data"' EXIT
printf 'p50 latency\t%s\t%s\t%s\t%s\np99 latency\t%s\t%s\t%s\t%s\n' \
	"$direct_p50" "$floor_p50" "$bolt_p50" "$redis_p50" "$direct_p99" "$floor_p99" "$bolt_p99" "$redis_p99" >"$data"

gnuplot <<GNUPLOT
set terminal pngcairo size 1100,440 font ",11" noenhanced
set output "$out_png"
set multiplot layout 1,2 title "Request to final reply: direct, bare-relay floor, conversation service on bbolt (fsync) and Redis (same broker, same run, median of runs)"
set datafile separator "\t"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set grid ytics
set ylabel "microseconds"
set title "Latency"
plot "$data" using 2:xtic(1) title "direct" lc rgb "#4e79a7", '' using 3 title "bare relay (floor)" lc rgb "#bab0ac", '' using 4 title "service, bbolt" lc rgb "#e15759", '' using 5 title "service, Redis" lc rgb "#f28e2b"
set title "Throughput, 16 concurrent requesters"
set ylabel "requests/s"
set yrange [0:*]
set xtics ("direct" 0, "floor" 1, "bbolt" 2, "Redis" 3)
set datafile separator whitespace
set boxwidth 0.5
plot "-" using 1:2 with boxes notitle lc rgb "#59a14f"
0 $direct_req
1 $floor_req
2 $bolt_req
3 $redis_req
e
unset multiplot
GNUPLOT
echo "wrote $out_png (p50 µs: direct $direct_p50, floor $floor_p50, bbolt $bolt_p50, Redis $redis_p50; req/s: direct $direct_req, floor $floor_req, bbolt $bolt_req, Redis $redis_req)"
