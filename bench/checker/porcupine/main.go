// Command porcupine-bench checks fencelab JSONL histories with Porcupine, for
// the side-by-side benchmark in bench/checker/run.py.
//
// Usage: porcupine-bench [-timeout 60s] history.jsonl...
//
// Each file is a cas-register history in fencelab's op record
// (docs/history-format.md). It is converted to Porcupine events with Jepsen
// semantics: invocations and completions are paired by process, `fail` ops
// are dropped, nemesis ops ignored, and an `info` op (or an invocation that
// never completed) returns after everything else, with an "unknown" output
// the model always accepts; so it may take effect at any point after its call
// or never. The history is partitioned by `key`. For every file one JSON object
// is printed: {"file", "valid": true|false|"unknown", "elapsed_s", "ops",
// "partitions", "peak_rss_kb", "cpu_s"}, where elapsed_s covers pairing, partitioning
// and CheckEvents (from parsed records to verdict, as on the Python side), cpu_s
// is the CPU time of the same span (all threads), and
// peak_rss_kb is the process's peak resident set (VmHWM) after the check.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"
)

const nilValue = int64(-1 << 62) // the state of an unset register

type opKind uint8

const (
	readOp opKind = iota
	writeOp
	casOp
)

type casInput struct {
	kind opKind
	a, b int64 // write: a; cas: a = old, b = new
}

type casOutput struct {
	value   int64 // read result
	unknown bool  // info: the op may or may not have happened
}

type keyed struct {
	key   string
	event porcupine.Event
}

// The cas-register with Jepsen semantics; partitions by key are built before the check.
var casRegister = porcupine.Model{
	Init: func() interface{} { return nilValue },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := state.(int64)
		in := input.(casInput)
		out := output.(casOutput)
		switch in.kind {
		case readOp:
			return out.unknown || out.value == st, st
		case writeOp:
			return true, in.a
		default:
			if st == in.a {
				return true, in.b
			}
			return out.unknown, st
		}
	},
	Hash: func(state interface{}) uint64 { return uint64(state.(int64)) },
	DescribeOperation: func(input, output interface{}) string {
		return fmt.Sprintf("%v -> %v", input, output)
	},
}

type record struct {
	Type    string          `json:"type"`
	Process json.RawMessage `json:"process"`
	F       string          `json:"f"`
	Value   json.RawMessage `json:"value"`
	Key     json.RawMessage `json:"key"`
	// Decoded from Value while reading (untimed, like the Python side's json.loads): an invoke's input, an
	// ok read's value.
	in   casInput
	read int64
}

func parseValue(raw json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return nilValue, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func parseInput(f string, raw json.RawMessage) (casInput, error) {
	switch f {
	case "read":
		return casInput{kind: readOp}, nil
	case "write":
		v, err := parseValue(raw)
		return casInput{kind: writeOp, a: v}, err
	case "cas":
		var pair []json.RawMessage
		if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
			return casInput{}, fmt.Errorf("cas value must be [old, new], got %s", raw)
		}
		a, err := parseValue(pair[0])
		if err != nil {
			return casInput{}, err
		}
		b, err := parseValue(pair[1])
		return casInput{kind: casOp, a: a, b: b}, err
	}
	return casInput{}, fmt.Errorf("unknown f %q", f)
}

type pending struct {
	id, client int
	key        string
	f          string
}

// readRecords parses one JSONL history, op values included (not timed: the
// Python side is timed from parsed records, values already Python ints and
// lists, too).
func readRecords(path string) ([]record, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var records []record
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(text), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if string(r.Process) != `"nemesis"` {
			switch {
			case r.Type == "invoke":
				r.in, err = parseInput(r.F, r.Value)
			case r.Type == "ok" && r.F == "read":
				r.read, err = parseValue(r.Value)
			}
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %v", path, line, err)
			}
		}
		records = append(records, r)
	}
	return records, sc.Err()
}

// toEvents pairs records into events in history order, with the returns of
// indeterminate ops at the end, each tagged with its key.
func toEvents(path string, records []record) ([]keyed, int, error) {
	var events, tail []keyed
	open := map[string]pending{}
	clients := map[string]int{}
	nextID := 0
	for i, r := range records {
		line := i + 1
		proc := string(r.Process)
		if proc == `"nemesis"` {
			continue
		}
		client, ok := clients[proc]
		if !ok {
			client = len(clients)
			clients[proc] = client
		}
		switch r.Type {
		case "invoke":
			in := r.in
			p := pending{id: nextID, client: client, key: string(r.Key), f: r.F}
			nextID++
			open[proc] = p
			events = append(events, keyed{p.key, porcupine.Event{ClientId: client, Kind: porcupine.CallEvent, Value: in, Id: p.id}})
		case "ok", "fail", "info":
			p, ok := open[proc]
			if !ok {
				return nil, 0, fmt.Errorf("%s:%d: completion without invocation", path, line)
			}
			delete(open, proc)
			switch r.Type {
			case "ok":
				out := casOutput{}
				if p.f == "read" {
					if r.F != "read" {
						return nil, 0, fmt.Errorf("%s:%d: completion f=%q does not match its invocation f=read", path, line, r.F)
					}
					out.value = r.read
				}
				events = append(events, keyed{p.key, porcupine.Event{ClientId: client, Kind: porcupine.ReturnEvent, Value: out, Id: p.id}})
			case "info":
				tail = append(tail, keyed{p.key, porcupine.Event{ClientId: client, Kind: porcupine.ReturnEvent, Value: casOutput{unknown: true}, Id: p.id}})
			case "fail":
				events = dropCall(events, p.id)
			}
		default:
			return nil, 0, fmt.Errorf("%s:%d: unknown type %q", path, line, r.Type)
		}
	}
	for _, p := range open { // never completed: indeterminate
		tail = append(tail, keyed{p.key, porcupine.Event{ClientId: p.client, Kind: porcupine.ReturnEvent, Value: casOutput{unknown: true}, Id: p.id}})
	}
	return append(events, tail...), nextID, nil
}

// dropCall removes the call event of a failed op (it did not happen).
func dropCall(events []keyed, id int) []keyed {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].event.Kind == porcupine.CallEvent && events[i].event.Id == id {
			return append(events[:i], events[i+1:]...)
		}
	}
	return events
}

// partitionByKey splits events by key, keeping history order in each partition.
func partitionByKey(events []keyed) [][]porcupine.Event {
	index := map[string]int{}
	var parts [][]porcupine.Event
	for _, e := range events {
		i, ok := index[e.key]
		if !ok {
			i = len(parts)
			index[e.key] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], e.event)
	}
	return parts
}

func peakRSSKB() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
	}
	return -1
}

// cpuSeconds is the process's CPU time so far (user + system, every thread: the
// partitions are checked in parallel goroutines, and the GC runs beside them).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func main() {
	timeout := flag.Duration("timeout", 0, "per-history time budget (0: none)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: porcupine-bench [-timeout 60s] history.jsonl...")
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, path := range flag.Args() {
		records, err := readRecords(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "porcupine-bench:", err)
			os.Exit(2)
		}
		start := time.Now()
		cpu0 := cpuSeconds()
		events, nops, err := toEvents(path, records)
		if err != nil {
			fmt.Fprintln(os.Stderr, "porcupine-bench:", err)
			os.Exit(2)
		}
		parts := partitionByKey(events)
		model := casRegister
		model.PartitionEvent = func([]porcupine.Event) [][]porcupine.Event { return parts }
		res := porcupine.CheckEventsTimeout(model, nil, *timeout)
		elapsed := time.Since(start).Seconds()
		cpu := cpuSeconds() - cpu0
		var valid interface{} = "unknown"
		switch res {
		case porcupine.Ok:
			valid = true
		case porcupine.Illegal:
			valid = false
		}
		_ = enc.Encode(map[string]interface{}{
			"file": path, "valid": valid, "elapsed_s": elapsed, "cpu_s": cpu, "ops": nops,
			"partitions": len(parts), "peak_rss_kb": peakRSSKB(),
		})
	}
}
