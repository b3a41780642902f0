/* SPDX-License-Identifier: Apache-2.0 */
/* topo.c: machine topology through hwloc: NUMA node count, the node nearest a PCI device,
 * binding host memory to a node (the host backend's numa=N option, pinned host memory) and
 * binding a thread to a node's cores (the threads that pre-fault pinned host memory).
 *
 * The topology is loaded once per process (pthread_once) with PCI devices kept, and never
 * freed (it is small and read-only after loading), except by the test seam
 * _expseg_topo_load_for_testing, which swaps in a machine described in hwloc's XML so that
 * the choice of node can be tested on a machine of one node. Built with EXPSEG_WITH_HWLOC=0,
 * the fallbacks say: one node, nearest node unknown (-1), binding unsupported. */
#include "vmm_impl.h"

#include <errno.h>
#include <string.h>

#ifndef EXPSEG_WITH_HWLOC
#define EXPSEG_WITH_HWLOC 0
#endif

#if EXPSEG_WITH_HWLOC
#include <hwloc.h>
#include <pthread.h>

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static hwloc_topology_t topo; /* NULL when loading failed */

/* This machine's topology (xml NULL) or the one an XML text describes; NULL on failure. */
static hwloc_topology_t topo_open(const char *xml) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return NULL;
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if ((xml && hwloc_topology_set_xmlbuffer(t, xml, (int)strlen(xml) + 1) != 0) ||
      hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    return NULL;
  }
  return t;
}

static void topo_load(void) { topo = topo_open(NULL); }

static hwloc_topology_t get_topo(void) {
  pthread_once(&topo_once, topo_load);
  return topo;
}

int _expseg_topo_numa_count(void) {
  hwloc_topology_t t = get_topo();
  int n = t ? hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) : 0;
  return n > 0 ? n : 1;
}

bool _expseg_topo_node_exists(int node) {
  hwloc_topology_t t = get_topo();
  if (node < 0) return false;
  if (!t || hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) <= 0) return node == 0;
  return hwloc_get_numanode_obj_by_os_index(t, (unsigned)node) != NULL;
}

int _expseg_topo_numa_of_pci(const char *pci_bus_id) {
  hwloc_topology_t t = get_topo();
  if (!t || !pci_bus_id) return -1;
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t, pci_bus_id);
  if (!dev) return -1;
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, dev);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

expseg_status _expseg_topo_bind(void *addr, size_t size, int node) {
  hwloc_topology_t t = get_topo();
  if (!t)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "topology: hwloc could not load the topology");
  hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(t, (unsigned)node);
  if (!obj || !obj->nodeset)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "topology: no NUMA node %d (this machine "
                             "has %d)", node, _expseg_topo_numa_count());
  if (hwloc_set_area_membind(t, addr, size, obj->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) != 0)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "topology: binding %zu bytes at %p to NUMA node %d failed: %s", size,
                             addr, node, strerror(errno));
  return EXPSEG_OK;
}

expseg_status _expseg_topo_bind_thread(int node) {
  hwloc_topology_t t = get_topo();
  hwloc_obj_t obj = t ? hwloc_get_numanode_obj_by_os_index(t, (unsigned)node) : NULL;
  if (!obj || !obj->cpuset || hwloc_bitmap_iszero(obj->cpuset))
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "topology: NUMA node %d has no cores "
                             "hwloc knows of", node);
  if (hwloc_set_cpubind(t, obj->cpuset, HWLOC_CPUBIND_THREAD) != 0)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "topology: binding a thread to the cores of NUMA node %d failed: %s",
                             node, strerror(errno));
  return EXPSEG_OK;
}

expseg_status _expseg_topo_load_for_testing(const char *xml) {
  pthread_once(&topo_once, topo_load);
  if (xml && strlen(xml) > INT32_MAX - 1)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "topology: an XML text of %zu bytes: "
                             "accepted up to 2 GiB", strlen(xml));
  hwloc_topology_t t = topo_open(xml);
  if (!t)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "topology: hwloc could not load %s",
                             xml ? "the XML text given" : "this machine's topology");
  if (topo) hwloc_topology_destroy(topo);
  topo = t;
  return EXPSEG_OK;
}

#else /* !EXPSEG_WITH_HWLOC */

int _expseg_topo_numa_count(void) { return 1; }

bool _expseg_topo_node_exists(int node) { return node == 0; }

int _expseg_topo_numa_of_pci(const char *pci_bus_id) {
  (void)pci_bus_id;
  return -1;
}

expseg_status _expseg_topo_bind(void *addr, size_t size, int node) {
  (void)addr, (void)size;
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "topology: cannot bind to NUMA node %d: expseg was built without "
                           "hwloc (EXPSEG_WITH_HWLOC=OFF)",
                           node);
}

expseg_status _expseg_topo_bind_thread(int node) {
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "topology: cannot bind a thread to NUMA node %d: built without hwloc",
                           node);
}

expseg_status _expseg_topo_load_for_testing(const char *xml) {
  (void)xml;
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "topology: no topology to load: built without hwloc");
}

#endif
