"""benchmarks/tools/sass_loops.py: loops and their instruction mix read off a cuobjdump listing."""

from benchmarks.tools import sass_loops

LISTING = """
        code for sm_90
                Function : kern_1_range_for
        .headerflags    @"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                     /* 0x00000a0000017a02 */
                                                                              /* 0x000fe40000000f00 */
        /*0010*/                   IMAD.WIDE R2, R5, 0x4, R6 ;                /* 0x0000000405027825 */
        /*0020*/                   LD.E R8, desc[UR4][R2.64] ;                /* 0x0000000402087980 */
        /*0030*/                   LDS R9, [R10+0x40] ;                       /* 0x000040000a097984 */
        /*0040*/                   FFMA.FTZ R11, R8.reuse, R9, R11 ;          /* 0x0000000908 0b7223 */
        /*0050*/                   FFMA.FTZ R12, R8, R9, R12 ;                /* 0x000000090 80c7223 */
        /*0060*/                   IADD3 R5, R5, 0x1, RZ ;                    /* 0x0000000105057810 */
        /*0070*/                   ISETP.GE.AND P0, PT, R5, R4, PT ;          /* 0x000000040500720c */
        /*0080*/              @!P0 BRA 0x10 ;                                 /* 0xfffffff000e08947 */
        /*0090*/               @P1 BRA 0xb0 ;                                 /* 0x0000001000001947 */
        /*00a0*/                   STG.E desc[UR4][R2.64], R11 ;              /* 0x0000000b02007986 */
        /*00b0*/                   EXIT ;                                     /* 0x000000000000794d */
                ..........
                Function : kern_0_serial
        /*0000*/                   EXIT ;                                     /* 0x000000000000794d */
"""


def test_loops_and_their_instruction_mix():
    fns = sass_loops.functions(LISTING)
    assert list(fns) == ["kern_1_range_for", "kern_0_serial"]
    assert len(fns["kern_1_range_for"]) == 12 and fns["kern_1_range_for"][8] == (0x80, "BRA 0x10")  # predicate dropped
    (loop,) = sass_loops.loops(fns["kern_1_range_for"])  # the forward branch to 0xb0 is no loop
    assert (loop["start"], loop["end"], loop["instructions"]) == (0x10, 0x80, 8)
    assert (loop["ffma"], loop["loads"], loop["integer"]) == (2, 2, 3)
    text = sass_loops.report(LISTING, ("kern_1",))
    assert "kern_0_serial" not in text and "8 per iteration, FFMA 2 (25%), loads 2, integer 3" in text
