// SPDX-License-Identifier: Apache-2.0
// test_gpu_numa.cpp: the NUMA node that pinned host copies are placed on, chosen from the
// topology, on the cuda backend against the CUDA driver double (label gpu; skips when
// libcuda.so.1 is not the double). The double names device d's PCI bus 0000:(d0+d):00.0;
// the topology is a machine described in hwloc's XML (_expseg_topo_load_for_testing), so a
// machine of one node can play one of two: device 0 sits under NUMA node 1, device 1 under
// the machine (both nodes: no one nearest), device 2 is not in the topology at all.
//
// What it shows: the node the driver finds (_expseg_vmm_host_numa), the node a sleeping
// region's host copies and the pinned host pool are asked for, and the fallbacks (no node
// when it is unknown on a machine of several; node 0 on a machine of one). What it cannot
// show: that the pages land on that node. An XML topology is not this machine, so hwloc's
// binding calls do nothing there; tests/test_gpu_host_pool.cpp checks real placement with
// move_pages on a real GPU machine.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "alloc_support.h"
#include "cudadouble.h"
#include "expseg_testing.h"
#include "sleep.h"

namespace {

constexpr size_t MiB = 1024 * 1024;

// Two packages, one NUMA node and one core each; a GPU behind a bridge of package 1 (bus
// d0), another behind a bridge of the machine (bus d1).
const char kTwoNodes[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x3" complete_cpuset="0x3" allowed_cpuset="0x3" nodeset="0x3" complete_nodeset="0x3" allowed_nodeset="0x3" gp_index="1">
  <object type="Package" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="2">
   <object type="NUMANode" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="3"/>
   <object type="Core" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="4">
    <object type="PU" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="5"/>
   </object>
  </object>
  <object type="Package" os_index="1" cpuset="0x2" complete_cpuset="0x2" nodeset="0x2" complete_nodeset="0x2" gp_index="6">
   <object type="NUMANode" os_index="1" cpuset="0x2" complete_cpuset="0x2" nodeset="0x2" complete_nodeset="0x2" gp_index="7"/>
   <object type="Core" os_index="1" cpuset="0x2" complete_cpuset="0x2" nodeset="0x2" complete_nodeset="0x2" gp_index="8">
    <object type="PU" os_index="1" cpuset="0x2" complete_cpuset="0x2" nodeset="0x2" complete_nodeset="0x2" gp_index="9"/>
   </object>
   <object type="Bridge" gp_index="10" bridge_type="0-1" depth="0" bridge_pci="0000:[d0-d0]">
    <object type="PCIDev" gp_index="11" pci_busid="0000:d0:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000"/>
   </object>
  </object>
  <object type="Bridge" gp_index="12" bridge_type="0-1" depth="0" bridge_pci="0000:[d1-d1]">
   <object type="PCIDev" gp_index="13" pci_busid="0000:d1:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000"/>
  </object>
 </object>
</topology>
)";

// One package, one NUMA node; no GPU in it.
const char kOneNode[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x1" complete_cpuset="0x1" allowed_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" allowed_nodeset="0x1" gp_index="1">
  <object type="Package" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="2">
   <object type="NUMANode" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="3"/>
   <object type="Core" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="4">
    <object type="PU" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="5"/>
   </object>
  </object>
 </object>
</topology>
)";

class Numa : public ::testing::Test {
protected:
  void SetUp() override {
    cudadouble_api api;
    if (!cudadouble_load(&api) || !_expseg_cuda_usable(0))
      GTEST_SKIP() << "libcuda.so.1 is not the CUDA driver double";
    ASSERT_EQ(0, api.configure("devices=3,capacity=256M,granularity=2M,recommended=2M"))
        << api.last_message();
  }
  void TearDown() override {
    EXPECT_EQ(_expseg_topo_load_for_testing(nullptr), EXPSEG_OK) << expseg_last_error();
  }

  // The node of the host copy of a region slept on device `device`, with its bytes checked
  // after the wake; also the node the driver reports.
  static void sleep_node(int device, int *driver_node, int *copy_node) {
    *driver_node = *copy_node = -2;
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("cuda", device, nullptr, &a), EXPSEG_OK) << expseg_last_error();
    *driver_node = _expseg_vmm_host_numa(a->drv);
    ASSERT_EQ(expseg_region_begin(a, "weights"), EXPSEG_OK) << expseg_last_error();
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &p), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_region_end(a, "weights"), EXPSEG_OK);
    std::string in(4 * MiB, '\0'), out(4 * MiB, '\0');
    for (size_t i = 0; i < in.size(); i++) in[i] = (char)(i * 131 + device);
    ASSERT_EQ(expseg_testing_copy_in(a, p, in.data(), in.size()), EXPSEG_OK);
    ASSERT_EQ(expseg_sleep(a, "weights", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(a->sleep->n, 1u);
    ASSERT_GE(a->sleep->r[0].n_segs, 1u);
    ASSERT_TRUE(a->sleep->r[0].segs[0].has_host);
    *copy_node = a->sleep->r[0].segs[0].host.numa_node;
    ASSERT_EQ(expseg_wake(a, "weights"), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_testing_copy_out(a, out.data(), p, out.size()), EXPSEG_OK);
    EXPECT_TRUE(in == out) << "bytes differ after the wake";
    EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
    expseg_testing_driver_counts left;
    expseg_testing_destroy(a, &left);
    EXPECT_EQ(left.live_chunks, 0);
  }

  static int pool_node(int device) {
    expseg_host_pool *h = nullptr;
    EXPECT_EQ(expseg_host_create("cuda", device, nullptr, &h), EXPSEG_OK) << expseg_last_error();
    int node = expseg_host_numa_node(h);
    expseg_host_destroy(h);
    return node;
  }
};

TEST_F(Numa, HostCopiesGoToTheNodeOfTheDevice) {
  ASSERT_EQ(_expseg_topo_load_for_testing(kTwoNodes), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(_expseg_topo_numa_count(), 2);
  ASSERT_EQ(_expseg_topo_numa_of_pci("0000:d0:00.0"), 1);
  int drv = -2, copy = -2;
  ASSERT_NO_FATAL_FAILURE(sleep_node(0, &drv, &copy));
  EXPECT_EQ(drv, 1);
  EXPECT_EQ(copy, 1);
  EXPECT_EQ(pool_node(0), 1);
}

TEST_F(Numa, NoNodeWhenTheDeviceHasNoNearestOfSeveral) {
  ASSERT_EQ(_expseg_topo_load_for_testing(kTwoNodes), EXPSEG_OK) << expseg_last_error();
  for (int device : {1, 2}) { // under the machine (both nodes); not in the topology
    SCOPED_TRACE(device);
    int drv = -2, copy = -2;
    ASSERT_NO_FATAL_FAILURE(sleep_node(device, &drv, &copy));
    EXPECT_EQ(drv, -1);
    EXPECT_EQ(copy, -1); // the OS's choice: no binding
    EXPECT_EQ(pool_node(device), -1);
  }
}

TEST_F(Numa, NodeZeroOnAMachineOfOneNode) {
  ASSERT_EQ(_expseg_topo_load_for_testing(kOneNode), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(_expseg_topo_numa_count(), 1);
  int drv = -2, copy = -2;
  ASSERT_NO_FATAL_FAILURE(sleep_node(0, &drv, &copy)); // its GPU is not in the topology
  EXPECT_EQ(drv, 0);
  EXPECT_EQ(copy, 0);
}

TEST_F(Numa, TextThatDoesNotLoadIsRefused) {
  EXPECT_EQ(_expseg_topo_load_for_testing("<topology"), EXPSEG_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(expseg_last_error(), "could not load the XML text"), nullptr)
      << expseg_last_error();
}

}  // namespace
