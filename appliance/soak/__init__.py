"""`appliance soak`: a bounded soak of a running (or freshly started) appliance under a mixed
load, judged by drift, leaks at idle and lost requests (cmd: flags; runner: the intervals;
load: the requests; rules: the verdict; report: JSON and plots)."""
