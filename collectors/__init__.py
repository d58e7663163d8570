"""Switch-side collectors (SNMP, gNMI, UFM, CLI), one module per protocol, all following one
contract; the application finds them through the `nms.collectors` entry-point group.

The first collector (SNMP) and the contract land with the SNMP collector issue.
"""
