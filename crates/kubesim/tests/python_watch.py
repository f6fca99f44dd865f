# Watches ConfigMaps with the official Python client (Debian's python3-kubernetes), which sends
# `watch=True`; prints "TYPE name" per event and stops after the DELETED event of argv[3].
# Driven by tests/hostile.rs: python3 python_watch.py KUBECONFIG NAMESPACE NAME
import sys

from kubernetes import client, config, watch

config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
w = watch.Watch()
for event in w.stream(v1.list_namespaced_config_map, namespace=sys.argv[2], timeout_seconds=60):
    name = event["object"].metadata.name
    if name == "kube-root-ca.crt":
        continue  # every namespace has it; the test watches its own
    print(event["type"], name, flush=True)
    if event["type"] == "DELETED" and name == sys.argv[3]:
        w.stop()
        break
print("END", flush=True)
